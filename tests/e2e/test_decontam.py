"""Decontamination on real documents (the sample corpus, ``curate sample``): recall of planted
benchmark passages, the program's removals in the ledger and its report.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from curation_dagster.tools.sample import build_sample
from stages.dataroot import DataRoot
from stages.decontam_sets import load_examples
from stages.kernels import decontam as D
from stages.store import Store
from tests.stages.programs.test_decontam import PASSAGES, QUESTIONS, _write_benchmarks

COMMON = ["it is important to note that", "for more information see the", "according to the survey of the"]

def _edit(passage: str, how: str) -> str:
    """The small edits a copied benchmark text picks up on the web."""
    words = passage.split()
    if how == "upper":
        return passage.upper()
    if how == "punct":  # punctuation stripped and some added, line breaks inside
        return " ".join(w.strip(",;.") + ("," if i % 7 == 3 else "") for i, w in enumerate(words)).replace(
            " the ", "\nthe ", 2)
    if how == "word":  # one word changed in the middle
        words[len(words) // 2] = "something"
        return " ".join(words)
    if how == "fullwidth":  # NFKC-equivalent characters
        return passage.replace("a", "ａ", 3)
    return passage

def _docstrings(n: int, tmp: Path) -> list[str]:
    folder = build_sample(tmp, max_docs_per_source=n)["docstrings"]
    texts = []
    for part in sorted(folder.glob("part-*")):
        data = gzip.decompress(part.read_bytes()) if part.name.endswith(".gz") else part.read_bytes()
        texts.extend(json.loads(line)["text"] for line in data.splitlines())
    return texts

def _plant(doc: str, passage: str, where: str) -> str:
    if where == "start":
        return f"{passage}\n\n{doc}"
    if where == "end":
        return f"{doc}\n{passage}"
    words = doc.split(" ")
    mid = len(words) // 2
    return " ".join(words[:mid]) + f" {passage} " + " ".join(words[mid:])

def test_recall_of_planted_passages_in_real_documents(tmp_path: Path) -> None:
    docs = _docstrings(200, tmp_path / "sample")
    assert len(docs) >= 150
    benchmarks = _write_benchmarks(tmp_path / "bench")
    examples = [e for b in benchmarks for e in load_examples(b)]
    assert [(e.benchmark, e.example_id) for e in examples] == [
        ("geo", "geo-1"), ("geo", "geo-2"), ("geo", "geo-3"), ("hist", "hist-1"), ("hist", "hist-2")]
    index = D.build_index([e.texts for e in examples], 13)

    rng = random.Random(0)
    planted: dict[int, str] = {}
    texts = list(docs)
    keys = list(PASSAGES)
    plans = [(key, how, where) for key in keys for how, where in
             [("none", "start"), ("upper", "middle"), ("punct", "end"), ("word", "middle"), ("fullwidth", "end")]]
    slots = rng.sample(range(len(texts)), len(plans) + 1)
    for slot, (key, how, where) in zip(slots, plans, strict=False):
        texts[slot] = _plant(texts[slot], _edit(PASSAGES[key], how), where)
        planted[slot] = key
    # A question (no passage) copied with an edit is contamination too.
    texts[slots[-1]] = _plant(texts[slots[-1]], QUESTIONS["geo-3"]["question"].upper(), "middle")
    planted[slots[-1]] = "geo-3"
    # Controls: common phrases shared with the benchmark, 12 consecutive benchmark words (one short
    # of an n-gram), and a passage cut into 8-word pieces with other text between them.
    free = [i for i in range(len(texts)) if i not in planted]
    controls = rng.sample(free, 6)
    for i, phrase in zip(controls[:3], COMMON, strict=True):
        texts[i] = _plant(texts[i], f"{phrase} {phrase.upper()} the interface", "middle")
    words = PASSAGES["geo-2"].split()
    texts[controls[3]] = _plant(texts[controls[3]], " ".join(words[5:17]), "end")
    texts[controls[4]] = " filler text here ".join(" ".join(words[i : i + 8]) for i in range(0, 40, 8))
    texts[controls[5]] = _plant(texts[controls[5]], " ".join(PASSAGES["hist-2"].split()[:12]), "start")

    best, count, _ = D.match(index, texts)
    found = {i: examples[best[i]].example_id for i in np.flatnonzero(count >= 1).tolist()}
    assert found == planted
    # Every planted copy keeps several intact n-grams, even with a word changed mid-passage.
    assert min(count[i] for i in planted) >= 3
    # The 12-word control really is 12 benchmark words in a row: as a 12-gram index it matches.
    assert D.match(D.build_index([e.texts for e in examples], 12), [texts[controls[3]]])[1][0] >= 1

def test_program_ledger_and_report(tmp_path: Path) -> None:
    from stages.spec import CrawlSpec
    from tests.support.tiny_corpus import read, run_all

    docs = _docstrings(60, tmp_path / "sample")
    rows: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for i, text in enumerate(docs[:40]):
        rows["a" if i % 2 == 0 else "b"].append({"id": f"d{i}", "text": text})
    rows["a"][3]["text"] = _plant(rows["a"][3]["text"], _edit(PASSAGES["geo-1"], "word"), "middle")
    rows["b"][5]["text"] = _plant(rows["b"][5]["text"], _edit(PASSAGES["hist-2"], "upper"), "start")
    rows["b"][6]["text"] = _plant(rows["b"][6]["text"], " ".join(PASSAGES["hist-1"].split()[:13]), "end")
    sources = {}
    for name, recs in rows.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        sources[name] = {"url": str(tmp_path / name), "id_field": "id"}
    benchmarks = [b.model_dump() for b in _write_benchmarks(tmp_path / "bench")]
    store = Store(str(tmp_path / "data"))

    def removed(min_matches: int) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        spec = CrawlSpec(crawl="c", sources=sources, stages=("decontam",), params={
            "contaminated_documents": {"benchmarks": benchmarks, "min_matches": min_matches}})
        report = run_all(store, spec)
        ledger = read(store, spec, "removal_ledger", "ledger")
        rows = ledger.filter(pc.equal(ledger["stage"], "decontam")).to_pylist()
        manifest = store.read_manifest(read_dir(store, spec))
        assert manifest is not None
        return report, sorted(rows, key=lambda r: r["record_id"]), manifest.report

    report, ledger, rep = removed(1)
    got = [(r["source"], r["record_id"], r["reason"], r["duplicate_of"], r["score"]) for r in ledger]
    n1 = len(PASSAGES["geo-1"].split()) - 13 + 1
    assert got == [
        ("b", "d11", "benchmark:hist", "hist:hist-2", float(len(PASSAGES["hist-2"].split()) - 13 + 1)),
        ("b", "d13", "benchmark:hist", "hist:hist-1", 1.0),
        ("a", "d6", "benchmark:geo", "geo:geo-1", float(n1 - 13)),  # the changed word breaks 13 n-grams
    ]
    assert report["sources"]["a"]["removed_per_stage"]["decontam"] == 1
    assert report["sources"]["b"]["removed_per_stage"]["decontam"] == 2
    assert rep["benchmarks"]["hist"]["removed_per_source"] == {"b": 2}
    assert rep["benchmarks"]["geo"] == {**rep["benchmarks"]["geo"], "removed": 1, "examples": 3,
                                        "examples_found": 1, "removed_per_source": {"a": 1}}
    # min_matches=2: the document sharing a single 13-gram stays.
    _, ledger2, _ = removed(2)
    assert [r["record_id"] for r in ledger2] == ["d11", "d6"]

def read_dir(store: Store, spec: Any) -> str:

    return DataRoot(store).output_dir(spec, "contaminated_documents", None)
