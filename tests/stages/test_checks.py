"""Check verdicts with no Dagster (``stages.checks``): a crawl run by ``stages.execute`` is judged
by every check kind that applies to its partitions, in a process that never imports Dagster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stages.catalog import PROGRAMS
from stages.checks import CHECK_KINDS, ChecksConfig, NotMaterialized, evaluate_over_deletion
from stages.params import RawDocumentsParams
from stages.spec import CrawlSpec
from stages.store import MANIFEST, Store
from tests.support.counting import count_params_validations

ROOT = Path(__file__).resolve().parents[2]
DOCS = 400  # per source, every text twice: exact dedup removes half of each


def _crawl(folder: Path) -> CrawlSpec:
    sources = {}
    for name in ("a", "b"):
        src = folder / "in" / name
        src.mkdir(parents=True)
        lines = [json.dumps({"id": f"{name}{i}", "text": f"{name} document number {i // 2}"}) for i in range(DOCS)]
        (src / "part.jsonl").write_text("\n".join(lines) + "\n")
        sources[name] = RawDocumentsParams(url=str(src))
    return CrawlSpec(crawl="c1", sources=sources, stages=("exact",))


def test_a_check_needs_a_committed_output(tmp_path: Path) -> None:
    with pytest.raises(NotMaterialized, match=r"^raw_documents\[c1\|a\] has no committed output for its current "
                                              r"parameters$"):
        evaluate_over_deletion(Store(str(tmp_path / "data")), _crawl(tmp_path), "exact_duplicates", None,
                               ChecksConfig())


def test_every_check_judges_a_crawl_without_dagster(tmp_path: Path) -> None:
    """The verdicts of every check of every partition, computed in a fresh interpreter that runs
    the crawl (``stages.execute``) and the checks; Dagster is never imported there."""
    script = f"""
import json, sys
from pathlib import Path
from tests.stages.test_checks import _crawl
from stages.catalog import PROGRAMS, partition_name
from stages.checks import CHECK_KINDS, ChecksConfig
from stages.execute import execute_crawl
from stages.params import ExecutionParams
from stages.store import Manifest, Store

spec = _crawl(Path({str(tmp_path)!r}))
store = Store({str(tmp_path / 'data')!r})
execute_crawl(store, spec, ExecutionParams(workers=1))
tight = ChecksConfig.model_validate({{"over_deletion": {{"max_removed_fraction": 0.4, "min_documents": 0}}}})
out = {{}}
for cfg_name, cfg in (("default", ChecksConfig()), ("tight", tight)):
    for program in PROGRAMS.values():
        for kind in CHECK_KINDS:
            if kind.applies(program):
                for source in spec.partitions(program.name):
                    v = kind.evaluate(store, spec, program.name, source, cfg)
                    name = partition_name(program.name, "c1", source)
                    out[f"{{cfg_name}} {{kind.name}} {{name}}"] = [v.passed, v.description]
print(json.dumps({{"dagster": sorted(m for m in sys.modules if m.split(".")[0] == "dagster"), "verdicts": out,
                  "off": [p for p in PROGRAMS if spec.switched_off(p)]}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["dagster"] == []
    verdicts = result["verdicts"]
    # Every check of every program the crawl runs; a switched-off program has no partition to judge.
    assert result["off"] and set(result["off"]) < set(PROGRAMS)
    expected = {(kind.name, p.name) for p in PROGRAMS.values() for kind in CHECK_KINDS
                if kind.applies(p) and p.name not in result["off"]}
    assert {(k.split(" ")[1], k.split(" ")[2].split("[")[0]) for k in verdicts} == expected
    failed = {k: d for k, (ok, d) in verdicts.items() if not ok}
    # At the default bounds every check passes; at 40% exact dedup's 50% of each source fails.
    assert set(failed) == {"tight over_deletion exact_duplicates[c1]"}
    assert failed["tight over_deletion exact_duplicates[c1]"].startswith(
        f"stage exact removed more than 40.0% of: a 50.0% ({DOCS // 2:,} of {DOCS:,}); "
        f"b 50.0% ({DOCS // 2:,} of {DOCS:,}); not applied")
    assert verdicts["default doc_id_unique raw_documents[c1|a]"] == [True, f"{DOCS:,} rows, every doc_id distinct"]
    assert verdicts["default ledger_consistency removal_ledger[c1]"][0] is True


def test_a_partitions_checks_read_each_manifest_once_within_manifests_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``over_deletion`` and ``empty_result`` of the crawl-wide remover read every source's
    ingestion and earlier removals: within ``manifests_read_once`` once for both (the same
    verdicts), outside it and after it as often as before (a manifest may change between evaluations)."""
    from stages.checks import manifests_read_once
    from stages.execute import execute_crawl
    from stages.params import ExecutionParams

    spec = _crawl(tmp_path)
    store = Store(str(tmp_path / "data"))
    execute_crawl(store, spec, ExecutionParams(workers=1))
    reads: list[str] = []  # the manifest files read from the data root
    real = Store.read_text

    def counted(self: Store, path: str) -> str | None:
        if path.endswith(MANIFEST):
            reads.append(path)
        return real(self, path)

    monkeypatch.setattr(Store, "read_text", counted)
    kinds = [k for k in CHECK_KINDS if k.name in ("over_deletion", "empty_result")]

    def judged() -> list[object]:
        return [k.evaluate(store, spec, "exact_duplicates", None, ChecksConfig()) for k in kinds]

    alone = judged()
    repeated = len(reads) - len(set(reads))
    assert repeated > 0
    reads.clear()
    with manifests_read_once():
        held = judged()
        assert len(reads) == len(set(reads))
        first = len(reads)
        judged()
        assert len(reads) == first  # a second evaluation in the block reads nothing again
    assert held == alone
    reads.clear()
    judged()
    assert len(reads) - len(set(reads)) == repeated  # nothing is held beyond the block


def test_a_partitions_checks_derive_the_keys_once_within_manifests_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each manifest's folder is named by its partition's key: within ``manifests_read_once`` the
    keys are looked up once for all of them (checking that cached keys still hold validates every
    program's params again), outside it once per manifest, as before."""
    from stages.checks import manifests_read_once
    from stages.execute import execute_crawl
    from stages.params import ExecutionParams

    spec = _crawl(tmp_path)
    store = Store(str(tmp_path / "data"))
    execute_crawl(store, spec, ExecutionParams(workers=1))
    validated = count_params_validations(monkeypatch)
    kinds = [k for k in CHECK_KINDS if k.name in ("over_deletion", "empty_result")]

    def judged() -> list[object]:
        return [k.evaluate(store, spec, "exact_duplicates", None, ChecksConfig()) for k in kinds]

    alone = judged()
    outside = len(validated)
    validated.clear()
    with manifests_read_once():
        assert judged() == alone
    assert 0 < len(validated) <= len(PROGRAMS)  # one key_map: each program's params once
    assert outside > 2 * len(PROGRAMS)
    validated.clear()
    judged()
    assert len(validated) == outside  # nothing is held beyond the block
