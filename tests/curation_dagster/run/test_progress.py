"""Long partitions say how far they are: ``stages.progress`` lines in the run's log in-process,
and on a warm stage worker's stderr (the run's compute log, not its events)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from curation_dagster.defs.assets import ASSETS
from curation_dagster.defs.partitions import CRAWL, SOURCE, partition_key
from curation_dagster.defs.resources import CurationResource, save_spec
from stages import params as P
from stages.progress import Progress
from stages.spec import CrawlSpec


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_come_at_most_every_interval_and_say_how_far() -> None:
    clock, lines = Clock(), []
    progress = Progress("document_embeddings[c1|web]", lines.append, interval_s=10, clock=clock)
    progress.expect(docs=125_000)
    progress.advance(20_000, 48_000_000)
    clock.now += 5
    progress.advance(20_000, 48_100_000)  # 5 s in: within the interval of the start, nothing
    assert lines == []
    clock.now += 45.0  # 50 s in
    progress.advance(0)
    assert lines == ["document_embeddings[c1|web]: 40,000 of 125,000 documents (32%), 96.1 MB, 800 docs/s, "
                     "~1m46s left"]
    clock.now += 1
    progress.advance(85_000)  # within the interval of the last line: nothing
    clock.now += 99
    progress.finish()
    assert lines[1:] == ["document_embeddings[c1|web]: done, 125,000 documents, 96.1 MB in 2m30s (833 docs/s)"]


def test_ingestion_shares_by_bytes_and_silence_costs_nothing() -> None:
    clock, lines = Clock(), []
    progress = Progress("raw_documents[c1|web]", lines.append, interval_s=1, clock=clock)
    progress.expect(nbytes=4_000_000)
    clock.now += 2
    progress.advance(500, 1_000_000)
    assert lines == ["raw_documents[c1|web]: 500 documents (25%), 1.0 of 4.0 MB, 250 docs/s, ~6s left"]
    silent = Progress()
    silent.advance(10, 10)
    silent.finish()
    assert (silent.docs, silent.bytes) == (10, 10)


@pytest.fixture
def workdir(tmp_path: Path) -> tuple[Path, CrawlSpec, int, int]:
    """Three files of 200 records each; a curate.yaml that asks for a line at every batch."""
    src = tmp_path / "web"
    src.mkdir()
    total = 0
    for f in range(3):
        text = "".join(json.dumps({"id": f"{f}-{i}", "text": f"Record {i} of file {f}: " + "words " * (5 + i % 7)})
                       + "\n" for i in range(200))
        (src / f"part-{f}.jsonl").write_text(text)
        total += len(text.encode())
    work = tmp_path / "w"
    work.mkdir()
    (work / "curate.yaml").write_text("execution: {progress_interval_s: 0.000001}\n")
    spec = CrawlSpec(crawl="c1", sources={"web": P.RawDocumentsParams(url=str(src), text_field="text")},
                     stages=("exact",))
    save_spec(work, spec)
    return work, spec, 600, total


@pytest.mark.parametrize("mode", ["in_process", "pipes"])
def test_a_partition_reports_progress(workdir: tuple[Path, CrawlSpec, int, int], mode: str,
                                      capfd: pytest.CaptureFixture[str]) -> None:
    work, spec, records, nbytes = workdir
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(CRAWL, ["c1"])
    instance.add_dynamic_partitions(SOURCE, ["web"])
    resource = CurationResource(workdir=str(work), mode=mode, workers=1, batch_rows=100)  # type: ignore[arg-type]
    logs: dict[str, list[str]] = {}
    for program, source in [("raw_documents", "web"), ("exact_duplicates", None)]:  # the crawl's (stage exact)
        result = materialize(ASSETS, selection=[program], partition_key=partition_key(spec.crawl, source),
                             instance=instance, resources={"curation": resource}, raise_on_error=False)
        assert result.success, [str(e) for e in result.all_events if e.is_failure]
        events = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message]
        if mode == "pipes":  # the worker's stderr (this process's: the workers inherit it), not events
            assert not [m for m in events if re.match(rf"{program}\[.*\]: ", m)], events
            events = capfd.readouterr().err.splitlines()
        logs[program] = events

    raw = [m for m in logs["raw_documents"] if m.startswith("raw_documents[c1|web]: ")]
    # By files, in input order: the share done grows to the whole input, and the closing line
    # counts every record and byte.
    shares = [int(s) for m in raw for s in re.findall(r"\((\d+)%\)", m)]
    assert shares == sorted(shares) and shares and shares[-1] >= 66, raw
    assert re.fullmatch(rf"raw_documents\[c1\|web\]: done, {records:,} documents, {nbytes / 1e6:,.1f} MB in \d+s "
                        r"\([\d,]+ docs/s\)", raw[-1]), raw
    # The crawl-level dedup reads the 600 survivors in batches of 100: six lines, then the total.
    exact = [m for m in logs["exact_duplicates"] if m.startswith("exact_duplicates[c1]: ")]
    counts = [int(m.split(": ")[1].split(" of ")[0].replace(",", "")) for m in exact if " of 600 documents" in m]
    assert counts == [100, 200, 300, 400, 500, 600], exact
    assert exact[-1].startswith(f"exact_duplicates[c1]: done, {records:,} documents, "), exact
