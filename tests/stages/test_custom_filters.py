"""Custom filters without a fork (stages.filters, docs/filters.md): a user's package of filters
(tests/data/plugin_pkg), registered by entry point or named as module:Class, runs inside the
heuristic stage with its own reason and count in the ledger and the report, cached scores, and
params keyed by its name, version and kwargs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stages.dataroot import DataRoot
from stages.execute import execute, execute_crawl
from stages.filters import FilterFailed
from stages.spec import CrawlSpec
from stages.store import Store
from tests.support.tiny_corpus import TINY

PLUGIN = Path(__file__).resolve().parents[1] / "data" / "plugin_pkg"
ENTRY_POINTS = """\
[curation_dagster.filters]
mentions_word = curate_plugin_filters:MentionsWord
digit_share = curate_plugin_filters:DigitShare
fragile = curate_plugin_filters:Fragile
"""
# Digits that are not a repeated n-gram (a repeated one fails max_top_2gram_char_frac first).
NUMBERS = "\nOrder numbers: 2000003 3000006 4000009 5000012 6000015 7000018 8000021 9000024."
WORD = " The zyzzyva is a weevil."
KEPT_NEWS = ("news-000", "news-001", "news-002", "news-003", "news-004", "news-005", "news-006", "news-007",
             "news-010", "news-011")  # the tiny corpus's news documents that every built-in rule keeps


def _news() -> dict[str, str]:
    out = {}
    for line in (TINY / "news" / "news-2024-05.jsonl").read_bytes().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("id") in KEPT_NEWS:
            out[rec["id"]] = rec["text"]
    return out


# Planted: 3 mention the word, 2 have a digit share above 5 % (8.4 %, 9.0 %), one has both (the
# first filter listed names it), one is too short for the built-in rules (min_words comes first).
def corpus() -> dict[str, str]:
    good = _news()
    texts = [good[k] for k in KEPT_NEWS]
    docs = {f"g{i}": t for i, t in enumerate(texts)}
    docs |= {f"w{i}": texts[i] + WORD for i in range(3)}
    docs |= {"d0": texts[3] + NUMBERS, "d1": texts[4] + NUMBERS}
    docs |= {"both": texts[5] + WORD + NUMBERS, "short": "A zyzzyva is short."}
    return docs


EXPECTED_REASONS = {**dict.fromkeys(["w0", "w1", "w2", "both"], "filter:mentions_word"),
                    **dict.fromkeys(["d0", "d1"], "filter:digit_share"), "short": "min_words"}


@pytest.fixture
def web(tmp_path: Path) -> Path:
    folder = tmp_path / "web"
    folder.mkdir()
    lines = [json.dumps({"id": k, "text": v}) for k, v in corpus().items()]
    (folder / "web.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The plugin package installed into a site folder on sys.path: its module and a dist-info
    declaring the entry points, which importlib.metadata finds as it finds any installed package."""
    folder = tmp_path / "site"
    shutil.copytree(PLUGIN / "curate_plugin_filters", folder / "curate_plugin_filters")
    info = folder / "curate_plugin_filters-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: curate-plugin-filters\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def spec(web: Path, filter_list: list[Any], crawl: str = "c1") -> CrawlSpec:
    return CrawlSpec(crawl=crawl, sources={"web": {"url": str(web)}}, stages=("heuristic",),
                     params={"filtered_documents": {"filters": filter_list}})


ENTRY_FILTERS: list[Any] = [{"filter": "mentions_word", "kwargs": {"word": "zyzzyva"}}, "digit_share"]


def _reasons(store: Store, crawl: CrawlSpec) -> dict[str, str]:
    ledger = store.read_table(DataRoot(store).output_dir(crawl, "removal_ledger", None), "ledger")
    return dict(zip(ledger["record_id"].to_pylist(), ledger["reason"].to_pylist(), strict=True))


def _report(store: Store, crawl: CrawlSpec, program: str, source: str | None = None) -> dict[str, Any]:
    manifest = DataRoot(store).manifest(crawl, program, source)
    assert manifest is not None
    return manifest.report


def test_entry_point_filters_run_in_the_heuristic_stage(tmp_path: Path, web: Path, site: Path) -> None:
    store = Store(str(tmp_path / "data"))
    crawl = spec(web, ENTRY_FILTERS)
    execute_crawl(store, crawl)
    heur = _report(store, crawl, "filtered_documents", "web")
    assert heur["removed_per_reason"] == {"filter:digit_share": 2, "filter:mentions_word": 4, "min_words": 1}
    assert heur["fails_per_rule"]["filter:mentions_word"] == 4
    # Each filter judges what the rules and the filters before it kept: 17 - 1, then 16 - 4.
    assert heur["custom_filters"] == {
        "mentions_word": {"version": 1, "input": 16, "scored": 16, "removed": 4},
        "digit_share": {"version": 1, "input": 12, "scored": 12, "removed": 2},
    }
    assert _reasons(store, crawl) == EXPECTED_REASONS
    ledger = _report(store, crawl, "removal_ledger")["sources"]["web"]
    assert ledger["removed_per_stage"]["heuristic"] == 7 and ledger["kept"] == 10
    assert ledger["filters"] == {"mentions_word": 4, "digit_share": 2}
    # The ledger's score is the filter's score: how many times the word occurs, the digit share.
    t = store.read_table(DataRoot(store).output_dir(crawl, "removal_ledger", None), "ledger").to_pylist()
    scores = {r["record_id"]: r["score"] for r in t}
    assert scores["w0"] == 1.0 and scores["both"] == 1.0
    assert scores["d1"] == pytest.approx(sum(c.isdigit() for c in corpus()["d1"]) / len(corpus()["d1"]))


def test_scores_are_cached_and_versions_rekey(
    tmp_path: Path, web: Path, site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(str(tmp_path / "data"))
    first = spec(web, ENTRY_FILTERS)
    execute_crawl(store, first)
    # A kwarg that only keep() reads (keep_kwargs): a new decision from cached scores.
    looser = spec(web, [ENTRY_FILTERS[0], {"filter": "digit_share", "kwargs": {"max_share": 0.085}}])
    assert looser.keys()[("filtered_documents", "web")] != first.keys()[("filtered_documents", "web")]
    execute(store, looser, "raw_documents", "web")
    execute(store, looser, "document_languages", "web")
    execute(store, looser, "filtered_documents", "web")
    heur = _report(store, looser, "filtered_documents", "web")
    assert heur["custom_filters"]["digit_share"] == {"version": 1, "input": 12, "scored": 0, "removed": 1}
    assert heur["custom_filters"]["mentions_word"]["scored"] == 0
    # A kwarg the score depends on: scored again.
    other_word = spec(web, [{"filter": "mentions_word", "kwargs": {"word": "weevil"}}])
    execute(store, other_word, "filtered_documents", "web")
    assert _report(store, other_word, "filtered_documents", "web")["custom_filters"]["mentions_word"] == {
        "version": 1, "input": 16, "scored": 16, "removed": 4}
    # A version bump re-keys this stage and everything after it, and scores again.
    from curate_plugin_filters import MentionsWord

    before = first.keys()
    monkeypatch.setattr(MentionsWord, "version", 2)
    bumped = spec(web, ENTRY_FILTERS)
    after = bumped.keys()
    changed = {part for part in before if before[part] != after[part]}
    assert ("raw_documents", "web") not in changed and ("document_languages", "web") not in changed
    assert {("filtered_documents", "web"), ("exact_duplicates", None), ("curated_documents", "web"),
            ("removal_ledger", None)} <= changed
    assert bumped.program_params("filtered_documents").canonical()["filters"][0]["version"] == 2
    execute(store, bumped, "filtered_documents", "web")
    assert _report(store, bumped, "filtered_documents", "web")["custom_filters"]["mentions_word"]["scored"] == 16


def test_a_filter_that_raises_fails_the_partition_naming_it_and_the_document(
    tmp_path: Path, web: Path, site: Path
) -> None:
    store = Store(str(tmp_path / "data"))
    crawl = spec(web, [{"filter": "fragile", "kwargs": {"marker": "zyzzyva"}}])
    execute(store, crawl, "raw_documents", "web")
    execute(store, crawl, "document_languages", "web")
    with pytest.raises(FilterFailed) as info:
        execute(store, crawl, "filtered_documents", "web")
    assert str(info.value).startswith("custom filter 'fragile' raised ValueError on document ")
    assert str(info.value).endswith(": cannot score a text with zyzzyva")
    assert "(record w0)" in str(info.value)  # the first planted one, in input order
    assert DataRoot(store).manifest(crawl, "filtered_documents", "web") is None


RAY_SCRIPT = """
import json, sys
from pathlib import Path
from stages.filters import FilterFailed
from stages.params import ExecutionParams
from stages.store import Store
from stages.dataroot import DataRoot
from stages.execute import execute_crawl
from stages.spec import CrawlSpec
tmp, web = Path(sys.argv[1]), sys.argv[2]
out = {}
for name, flt in (("ok", {"filter": "curate_plugin_filters:MentionsWord", "kwargs": {"word": "zyzzyva"}}),
                  ("fails", {"filter": "curate_plugin_filters:Fragile", "kwargs": {"marker": "zyzzyva"}})):
    spec = CrawlSpec(crawl=name, sources={"web": {"url": web}}, stages=("heuristic",),
                     params={"filtered_documents": {"filters": [flt]}})
    store = Store(str(tmp / "data"))
    try:
        execute_crawl(store, spec, ExecutionParams(executor="ray", workers=2))
        out[name] = DataRoot(store).manifest(spec, "filtered_documents", "web").report
    except FilterFailed as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_filters_on_ray_workers(tmp_path: Path, web: Path) -> None:
    # A fresh process: its Ray workers find the package as a cluster's would (installed, here on
    # PYTHONPATH), and a failure in a Ray task is still the filter's one line, not a traceback.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGIN), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", RAY_SCRIPT, str(tmp_path), str(web)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ok"]["custom_filters"] == {"mentions_word": {"version": 1, "input": 16, "scored": 16, "removed": 4}}
    assert out["fails"].startswith("custom filter 'fragile' raised ValueError on document ")
    assert out["fails"].endswith("(record w0): cannot score a text with zyzzyva")
