"""Fuzzy dedup on real text (the sample corpus, ``curate sample``) against an exact oracle, and through
``curate run``: resharding changes no decision, verification block by block, spills, curate.yaml's
execution section.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from curation_dagster.tools.sample import build_sample
from stages.dataroot import DataRoot
from stages.execute import execute_crawl
from stages.reports import FuzzyDuplicatesReport, read_as
from stages.spec import CrawlSpec
from stages.store import Store

SHINGLE = 24

THRESHOLD = 0.8

def _variant(text: str, rng: random.Random, edits: int) -> str:
    """A near-duplicate: ``edits`` words replaced, one line appended or dropped."""
    words = text.split(" ")
    for _ in range(edits):
        i = rng.randrange(len(words))
        words[i] = rng.choice(["data", "value", "result", "system", "record", "item"])
    out = " ".join(words)
    return out + "\n\nMirrored copy." if rng.random() < 0.5 else out

@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, str]]]:
    root = tmp_path_factory.mktemp("fuzzy")
    folders = build_sample(root / "sample", max_docs_per_source=400)
    rng = random.Random(7)
    originals = [json.loads(line) for line in (folders["docstrings"] / "part-00000.jsonl").read_text().splitlines()]
    originals = [r for r in originals if len(r["text"]) > 600]
    mirror = []
    for k, rec in enumerate(rng.sample(originals, min(80, len(originals)))):
        for j in range(rng.choice([1, 1, 2])):
            edits = rng.choice([1, 2, 3, 5, 8, 15])
            mirror.append({"id": f"m{k}-{j}", "text": _variant(rec["text"], rng, edits)})
    (root / "mirror").mkdir()
    (root / "mirror" / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mirror))
    sources = {name: {"url": str(path), "id_field": "id"} for name, path in folders.items() if name != "scraps"}
    sources["mirror"] = {"url": str(root / "mirror"), "id_field": "id"}
    return root, [{"name": k, **v} for k, v in sources.items()]

def _run(root: Path, sources: list[dict[str, str]], work: str, **params: object) -> tuple[Store, CrawlSpec]:
    spec = CrawlSpec(
        crawl="c1",
        sources={s["name"]: {k: v for k, v in s.items() if k != "name"} for s in sources},
        stages=("fuzzy",),
        params=params,  # type: ignore[arg-type]
    )
    store = Store(str(root / work))
    execute_crawl(store, spec)
    return store, spec

def _oracle(store: Store, spec: CrawlSpec) -> tuple[list[str], csr_matrix]:
    """doc_ids and the sparse matrix of exact Jaccard >= 0.5 between them (upper triangle)."""
    ids: list[str] = []
    rows: list[int] = []
    cols: list[int] = []
    vocab: dict[str, int] = {}
    for source in sorted(spec.sources):
        t = store.read_table(DataRoot(store).output_dir(spec, "raw_documents", source), "documents")
        for doc_id, text in zip(t["doc_id"].to_pylist(), t["text"].to_pylist(), strict=True):
            grams = {text} if len(text) < SHINGLE else {text[i : i + SHINGLE] for i in range(len(text) - SHINGLE + 1)}
            r = len(ids)
            ids.append(doc_id)
            for g in grams:
                rows.append(r)
                cols.append(vocab.setdefault(g, len(vocab)))
    m = csr_matrix((np.ones(len(rows), np.int32), (rows, cols)), shape=(len(ids), len(vocab)))
    sizes = np.asarray(m.sum(axis=1)).ravel()
    inter = (m @ m.T).tocoo()
    keep = inter.row < inter.col
    r, c, v = inter.row[keep], inter.col[keep], inter.data[keep]
    jac = v / (sizes[r] + sizes[c] - v)
    sel = jac >= 0.5
    return ids, csr_matrix((jac[sel], (r[sel], c[sel])), shape=(len(ids), len(ids)))

def _perfect_removed(ids: list[str], jac: csr_matrix) -> tuple[int, set[str]]:
    strong = jac.multiply(jac >= THRESHOLD)
    n, labels = connected_components(strong, directed=False)
    sizes = np.bincount(labels, minlength=n)
    clustered = {ids[i] for i in np.flatnonzero(sizes[labels] > 1)}
    return int((sizes[sizes > 1] - 1).sum()), clustered

def _fuzzy_outputs(store: Store, spec: CrawlSpec) -> tuple[list[str], set[str]]:
    removed = store.read_table(DataRoot(store).output_dir(spec, "fuzzy_duplicates", None), "removed")
    comps = store.read_table(DataRoot(store).output_dir(spec, "duplicate_components", None), "components")
    return removed["doc_id"].to_pylist(), set(comps["doc_id"].to_pylist())

def test_default_fuzzy_matches_exact_oracle(corpus: tuple[Path, list[dict[str, str]]]) -> None:
    root, sources = corpus
    store, spec = _run(root, sources, "default")
    ids, jac = _oracle(store, spec)
    perfect, oracle_clustered = _perfect_removed(ids, jac)
    removed, clustered = _fuzzy_outputs(store, spec)
    assert perfect > 50, "the corpus must hold planted and natural near-duplicates"
    assert abs(len(removed) - perfect) <= max(1, int(np.ceil(0.01 * perfect))), (len(removed), perfect)
    # every removed document has a true partner above the verification threshold
    index = {d: i for i, d in enumerate(ids)}
    sym = (jac + jac.T).tocsr()
    for doc in removed:
        row = sym.getrow(index[doc])
        assert row.nnz and row.data.max() >= THRESHOLD, doc
    agreement = len(clustered & oracle_clustered) / len(clustered | oracle_clustered)
    assert agreement >= 0.995, agreement
    # input: every document that reached the stage (only fuzzy removes here, so all of them),
    # not the fewer ones in components
    report = read_as(DataRoot(store).manifest(spec, "fuzzy_duplicates", None),
                     FuzzyDuplicatesReport)
    assert (report.input, report.removed) == (len(ids), len(removed)) and len(clustered) < len(ids)


def test_seed_preset_without_verification_keeps_partners_above_half(corpus: tuple[Path, list[dict[str, str]]]) -> None:
    """20 x 13 without verification: every removed doc still has some partner >= 0.5 (the
    LSH curve), but the exact check is what guarantees partners above the threshold."""
    root, sources = corpus
    store, spec = _run(root, sources, "seed", lsh_buckets={"preset": "seed"}, duplicate_components={"verify": "none"})
    ids, jac = _oracle(store, spec)
    removed, _ = _fuzzy_outputs(store, spec)
    index = {d: i for i, d in enumerate(ids)}
    sym = (jac + jac.T).tocsr()
    lacking = [d for d in removed if sym.getrow(index[d]).nnz == 0]
    assert len(lacking) <= 0.01 * max(1, len(removed))

def test_resharding_and_order_change_no_decision(corpus: tuple[Path, list[dict[str, str]]], tmp_path: Path) -> None:
    root, sources = corpus
    store, spec = _run(root, sources, "default")
    base, _ = _fuzzy_outputs(store, spec)
    removed_a = store.read_table(DataRoot(store).output_dir(spec, "fuzzy_duplicates", None), "removed")
    # merge every source's files into one reversed file
    lines = []
    for name in ("docstrings", "licenses", "package_docs"):
        folder = Path(next(s["url"] for s in sources if s["name"] == name))
        for part in sorted(folder.iterdir()):
            import gzip

            data = gzip.decompress(part.read_bytes()) if part.suffix == ".gz" else part.read_bytes()
            lines.extend((name, line) for line in data.decode().splitlines() if line.strip())
    resharded = []
    for name in ("docstrings", "licenses", "package_docs"):
        folder = tmp_path / name
        folder.mkdir()
        mine = [line for n, line in lines if n == name][::-1]
        half = len(mine) // 2
        (folder / "a.jsonl").write_text("\n".join(mine[:half]) + "\n")
        (folder / "b.jsonl").write_text("\n".join(mine[half:]) + "\n")
        resharded.append({"name": name, "url": str(folder), "id_field": "id"})
    resharded.append(next(s for s in sources if s["name"] == "mirror"))
    store2, spec2 = _run(tmp_path, resharded, "resharded")
    removed_b = store2.read_table(DataRoot(store2).output_dir(spec2, "fuzzy_duplicates", None), "removed")
    key = ["doc_id", "duplicate_of"]
    a = set(zip(*(removed_a[k].to_pylist() for k in key), strict=True))
    b = set(zip(*(removed_b[k].to_pylist() for k in key), strict=True))
    assert a == b and len(a) == len(base)
    assert pc.all(pc.greater_equal(removed_a["score"], 0.0)).as_py()

def test_block_wise_verification_gives_the_same_edges(corpus: tuple[Path, list[dict[str, str]]]) -> None:
    """Reading candidate texts in small blocks (spilled to disk) changes no verified edge or score."""
    from stages.execute import execute
    from stages.params import ExecutionParams

    root, sources = corpus
    store, spec = _run(root, sources, "default")
    whole = store.read_table(DataRoot(store).output_dir(spec, "duplicate_components", None), "edges")
    outcome = execute(store, spec, "duplicate_components", None, ExecutionParams(text_block_bytes=40_000), force=True)
    report = outcome.manifest.report
    assert report["text_blocks"] > 5 and report["text_spilled"] and report["candidate_text_bytes"] > 40_000
    blocked = store.read_table(DataRoot(store).output_dir(spec, "duplicate_components", None), "edges")
    assert blocked.equals(whole)
    # the removal list's scores are read the same way
    removed = store.read_table(DataRoot(store).output_dir(spec, "fuzzy_duplicates", None), "removed")
    execute(store, spec, "fuzzy_duplicates", None, ExecutionParams(text_block_bytes=40_000), force=True)
    again = store.read_table(DataRoot(store).output_dir(spec, "fuzzy_duplicates", None), "removed")
    assert again.equals(removed) and removed.num_rows > 0

def test_a_spill_without_room_fails_first_in_one_line_naming_the_settings(
    corpus: tuple[Path, list[dict[str, str]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spilling candidate texts to TMPDIR checks its free space before it writes: asked to keep
    more free than the disk has, the stage fails in one line naming text_block_bytes, TMPDIR and
    CURATE_K8S_TMP_GIB, and leaves nothing in TMPDIR; in memory (no spill) it never checks."""
    import shutil
    import tempfile

    from stages.execute import execute
    from stages.pair_texts import SpillSpaceError
    from stages.params import ExecutionParams

    root, sources = corpus
    store, spec = _run(root, sources, "default")
    spill = tmp_path / "tmp"
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    beyond = shutil.disk_usage(spill).free + (1 << 40)
    with pytest.raises(SpillSpaceError) as exc:
        execute(store, spec, "duplicate_components", None,
                ExecutionParams(text_block_bytes=40_000, spill_reserve_bytes=beyond), force=True)
    message = str(exc.value)
    assert len(message.splitlines()) == 1 and str(spill) in message, message
    for setting in ("text_block_bytes", "TMPDIR", "CURATE_K8S_TMP_GIB", "spill_reserve_bytes"):
        assert setting in message, (setting, message)
    assert list(spill.iterdir()) == []
    outcome = execute(store, spec, "duplicate_components", None, ExecutionParams(spill_reserve_bytes=beyond),
                      force=True)
    assert not outcome.manifest.report["text_spilled"]

@pytest.mark.parametrize("mode", ["in_process", "pipes"])
def test_curate_yaml_execution_section_tunes_runs(corpus: tuple[Path, list[dict[str, str]]], tmp_path: Path,
                                                  mode: str) -> None:
    """``execution:`` in curate.yaml reaches in-process runs and stage subprocesses (Pipes) alike:
    a tiny text budget makes fuzzy verification spill and read many blocks, with the edges and
    the removal list of the in-memory run."""
    import shutil

    import yaml

    from curation_dagster import cli
    from curation_dagster.defs.resources import CurationResource, load_spec
    from curation_dagster.run.in_process import run_crawl

    _, sources = corpus
    work = tmp_path / "w"
    work.mkdir()
    (work / "curate.yaml").write_text(yaml.safe_dump({"checks": {"over_deletion": {"max_removed_fraction": 1.0}}}))
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"sources": {s["name"]: {k: v for k, v in s.items() if k != "name"}
                                              for s in sources}}))
    assert cli.main(["run", "--workdir", str(work), "--crawl", "c1", "--config", str(config), "--stages", "fuzzy",
                     "--quiet"]) == 0
    spec = load_spec(str(work), "c1")
    store = CurationResource(workdir=str(work)).store()
    comps = DataRoot(store).output_dir(spec, "duplicate_components", None)
    fuzzy = DataRoot(store).output_dir(spec, "fuzzy_duplicates", None)
    want = store.read_table(comps, "edges"), store.read_table(fuzzy, "removed")
    assert store.read_manifest(comps).report["text_blocks"] <= 2 and want[0].num_rows > 0  # in memory
    (work / "curate.yaml").write_text(yaml.safe_dump({"checks": {"over_deletion": {"max_removed_fraction": 1.0}},
                                                      "execution": {"text_block_bytes": 40_000}}))
    shutil.rmtree(comps)
    shutil.rmtree(fuzzy)
    run_crawl(work, work / "dagster", spec, quiet=True, resource=CurationResource(workdir=str(work), mode=mode))
    assert store.read_manifest(comps).report["text_blocks"] > 3
    assert store.read_table(comps, "edges").equals(want[0]) and store.read_table(fuzzy, "removed").equals(want[1])

def test_every_score_is_the_exact_jaccard_with_the_survivor(corpus: tuple[Path, list[dict[str, str]]]) -> None:
    """Each removed document's ``score`` is the exact Jaccard of its text and its survivor's,
    read from the verified edge or, where the two are linked only through a chain, computed from
    the texts of the sources that hold them (``stages.removal.raw_dirs``' ``holding``)."""
    from stages.kernels.lsh import pair_jaccard

    root, sources = corpus
    store, spec = _run(root, sources, "default")
    removed = store.read_table(DataRoot(store).output_dir(spec, "fuzzy_duplicates", None), "removed").to_pylist()
    texts: dict[str, str] = {}
    for source in spec.sources:
        t = store.read_table(DataRoot(store).output_dir(spec, "raw_documents", source), "documents", ["doc_id", "text"])
        texts.update(zip(t["doc_id"].to_pylist(), t["text"].to_pylist(), strict=True))
    docs = [texts[r["doc_id"]] for r in removed] + [texts[r["duplicate_of"]] for r in removed]
    n = len(removed)
    exact = pair_jaccard(docs, np.arange(n), np.arange(n, 2 * n))
    assert n > 0 and [r["score"] for r in removed] == pytest.approx(exact.tolist(), abs=0)
