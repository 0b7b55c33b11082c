"""Semantic dedup on real text (the sample corpus, ``curate sample``): k-means partitioning's recall,
and the stage end to end through ``curate run`` with its audit.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from stages.dataroot import DataRoot
from stages.kernels.semantic import (
    duplicate_mask,
    max_earlier_similarity,
    partitioned_similarity,
    semantic_clusters,
)
from tests.stages.programs.test_semantic import (
    EPS,
    PARAPHRASES,
    TEMPLATED,
    enc,  # noqa: F401 (a fixture)
)


def stdlib_docstrings(tmp: Path, n: int) -> list[str]:
    from curation_dagster.tools.sample import build_sample

    folder = build_sample(tmp, max_docs_per_source=n)["docstrings"]
    texts: list[str] = []
    for part in sorted(folder.iterdir()):
        opener = gzip.open if part.name.endswith(".gz") else open
        with opener(part, "rt") as fh:
            texts.extend(json.loads(line)["text"] for line in fh if line.strip())
    return texts

@pytest.mark.slow
def test_kmeans_partitioning_loses_at_most_one_percent_recall(enc, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811 (the fixture)
    """Real docstrings; SemDeDup with the keep rule's order in one all-pairs cluster against the
    k-means partition with the default spill margin (clusters of ~40, far smaller than the
    default 1000, to stress the cuts)."""
    from stages.programs.document_embeddings import encoder

    small = encoder("all-MiniLM-L6-v2", "cpu", 64)  # short windows: this test is about clusters
    texts = stdlib_docstrings(tmp_path, 500)
    x = small.embed(small.tokenize(texts))
    xt = torch.from_numpy(x)
    eps = 0.1
    rank = np.arange(len(x))  # the keep rule's order: one total order over the corpus
    all_sim, _ = max_earlier_similarity(xt)
    base = duplicate_mask(all_sim, eps)
    labels, _, second, stats = semantic_clusters(xt, math.ceil(len(x) / 40), 200, 40, 0.5, 10, 30, 42, 0.05)
    part_sim, _ = partitioned_similarity(xt, labels, second, rank)
    part = duplicate_mask(part_sim, eps)
    assert base.sum() >= 20  # enough duplicates for the ratio to mean something
    assert not (part & ~base).any()  # a partition can only lose pairs
    assert part.sum() / base.sum() >= 0.99, (int(part.sum()), int(base.sum()), stats)

def write_source(folder: Path, docs: dict[str, str]) -> Path:
    folder.mkdir(parents=True)
    (folder / "part.jsonl").write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in docs.items()))
    return folder

@pytest.mark.slow
def test_the_semantic_stage_end_to_end_and_its_audit(tmp_path: Path) -> None:
    """Two sources (wire before blog in the keep rule): the blog's rewrites of two wire stories
    are removed by stage ``semantic`` as duplicates of the wire originals; its verbatim copy of
    one is removed by ``exact`` and is never embedded; templated listings stay. A
    third source loses everything to the heuristics and embeds nothing. The outputs live outside
    the workdir (as after ``curate run --data-root``), where the audit must find them."""
    from curation_dagster import cli
    from curation_dagster.defs.resources import save_spec
    from stages.dataroot import DATA_ROOT_FILE
    from stages.execute import execute
    from stages.spec import CrawlSpec
    from stages.store import Store

    wire = {"vaccine": PARAPHRASES["vaccine"][0], "bridge": PARAPHRASES["bridge"][0], "boots": TEMPLATED[0]}
    blog = {"vaccine2": PARAPHRASES["vaccine"][1], "bridge2": PARAPHRASES["bridge"][1],
            "bridge-copy": PARAPHRASES["bridge"][0], "espresso": TEMPLATED[1], "bicycle": TEMPLATED[2]}
    spec = CrawlSpec.model_validate({
        "crawl": "c1",
        "sources": {name: {"url": str(write_source(tmp_path / "in" / name, docs)), "id_field": "id"}
                    for name, docs in (("wire", wire), ("blog", blog), ("junk", {"j1": "buy now $$$"}))},
        "stages": ("heuristic", "exact", "fuzzy", "semantic"),
        "keep": {"source_priority": {"wire": 0, "blog": 1}},
    })
    work = tmp_path / "work"
    work.mkdir()
    (work / DATA_ROOT_FILE).write_text(str(tmp_path / "elsewhere") + "\n")
    save_spec(work, spec)  # the spec lives in the data root too
    store = Store(str(tmp_path / "elsewhere"))
    for program in ("raw_documents", "document_languages", "filtered_documents", "exact_duplicates",
                    "minhash_signatures", "lsh_buckets", "duplicate_components", "fuzzy_duplicates",
                    "document_embeddings", "semantic_clusters", "semantic_duplicates"):
        for source in spec.partitions(program):
            execute(store, spec, program, source)

    def table(program: str, name: str, source: str | None = None) -> list[dict]:  # type: ignore[type-arg]
        return store.read_table(DataRoot(store).output_dir(spec, program, source), name).to_pylist()

    assert table("document_embeddings", "embeddings", "junk") == []  # no heuristic survivor
    record = {r["doc_id"]: (r["source"], r["record_id"]) for s in ("wire", "blog")
              for r in table("raw_documents", "documents", s)}
    assert [record[r["doc_id"]] for r in table("filtered_documents", "removed", "blog")] == []
    assert [record[r["doc_id"]] for r in table("exact_duplicates", "removed")] == [("blog", "bridge-copy")]
    removed = {record[r["doc_id"]]: r for r in table("semantic_duplicates", "removed")}
    assert set(removed) == {("blog", "vaccine2"), ("blog", "bridge2")}
    for (_, rec), row in removed.items():
        assert record[row["duplicate_of"]] == ("wire", rec.removesuffix("2"))
        assert row["duplicate_of_source"] == "wire" and row["reason"] == "semantic_duplicate"
        assert 1 - EPS <= row["score"] <= 1.0
    neighbors = table("semantic_duplicates", "neighbors")
    seen = {record[r["doc_id"]] for r in neighbors} | {record[r["neighbor"]] for r in neighbors if r["neighbor"]}
    assert ("blog", "bridge-copy") not in seen and len(neighbors) == 7
    # The blog's exact copy was never embedded: embeddings see only exact/fuzzy survivors.
    emb = table("document_embeddings", "embeddings", "blog")
    assert len(emb) == 4 and len(emb[0]["embedding"]) == 384
    assert ("blog", "bridge-copy") not in {record[r["doc_id"]] for r in emb}
    assert table("semantic_clusters", "clusters") and execute(
        store, spec, "semantic_clusters", None).manifest.report["dropped"] == 0  # nothing left to drop

    out = tmp_path / "audit.html"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = cli.main(["semantic-audit", "--workdir", str(work), "--crawl", "c1", "--out", str(out)])
    assert code == 0, stdout.getvalue()
    page = out.read_text()
    assert "Semantic dedup audit: crawl c1" in page
    assert "inspectors found serious cracks" in page and "has been closed by the county" in page  # side by side
    md = tmp_path / "audit.md"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["semantic-audit", "--workdir", str(work), "--crawl", "c1", "--out", str(md)]) == 0
    assert "| kept / earlier | document |" in md.read_text()
