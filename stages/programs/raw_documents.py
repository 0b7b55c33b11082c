"""raw_documents[source, crawl]: ingest JSONL or Parquet records and assign stable doc_ids.

A short composition of ``stages.ingest``: list the source's files and refuse what is neither
JSONL nor Parquet (``files``), cut them into tasks that parse and validate in parallel
(``tasks``), judge every record on its own (``records``), and assign content-derived ids in
input order while writing the parts (``ids``, ``writer``).

Nothing is lost in silence: a bad record is quarantined with a reason; a damaged file (truncated
or corrupt compression or Parquet) keeps its records before the damage and is reported in
``damaged_files`` with the bytes that could not be read (a blocking check fails the source unless
the crawl allows damaged files); the store failing to deliver bytes is retried, then fails the
partition in one line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Iterator
from contextlib import closing

from stages.ingest.files import NoInputError, UnsupportedFileError, fingerprint, list_files
from stages.ingest.records import Done
from stages.ingest.spool import Spooling, unspooled
from stages.ingest.streams import InputReadError
from stages.ingest.tasks import RangeTask, Task, split_files
from stages.ingest.writer import DOCUMENTS, QUARANTINE, Output
from stages.parallel import zip_results
from stages.params import ExecutionParams, RawDocumentsParams
from stages.reports import DamagedFile, RawDocumentsReport
from stages.scratch import scratch
from stages.store import PartitionWriter
from stages.task import Inputs, Partition

__all__ = ["DOCUMENTS", "QUARANTINE", "InputReadError", "NoInputError", "UnsupportedFileError", "fingerprint",
           "list_files", "run"]
IGNORED_SHOWN = 20  # ignored file names listed in the report


def _run_task(task: Task) -> Done:
    """One task, in a worker process or a Ray task (a module-level function: picklable)."""
    return task.run()


def _in_parallel(tasks: Iterator[Task], execution: ExecutionParams) -> Generator[tuple[Task, Done], None, None]:
    """(task, what it found), in input order, the tasks run by ``execution``'s executor; a local
    pool's workers hand their documents over through files (``stages.ingest.spool``)."""
    if execution.executor == "ray":
        yield from zip_results(tasks, _run_task, execution)
        return
    with scratch("ingest") as folder:
        for task, done in zip_results(tasks, Spooling(folder), execution):
            yield task, unspooled(done)


def run(
    params: RawDocumentsParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> RawDocumentsReport:
    """Ingest one source. Report: input, documents, quarantined, per-reason counts, files, damaged
    files and unread bytes, ignored files, chars, blank lines, empty files, tasks."""
    assert partition.source is not None
    fs, files, ignored = list_files(params)
    step = execution.ingest_task_bytes
    out = Output(output, params, partition.crawl, partition.source, execution.batch_rows)
    tasks = split_files(fs, files, params, step)
    done_tasks: Generator[tuple[Task, Done], None, None]
    if sum(f.size for f in files) > step and (execution.executor == "ray" or execution.resolved_workers() > 1):
        done_tasks = _in_parallel(tasks, execution)
    else:  # one task's worth of input: no pool to start
        done_tasks = ((task, task.run()) for task in tasks)
    blank = n_tasks = 0
    lines: Counter[str] = Counter()  # lines (rows) read so far per file, to number them across tasks
    records: Counter[str] = Counter()
    # Progress by input bytes: a byte range as it is read, any other file once its last task is
    # done (tasks come back in input order, so a new path means the previous file is done).
    progress, credited, previous = partition.progress, Counter[str](), None
    progress.expect(nbytes=sum(f.size for f in files))
    with closing(done_tasks):  # a failure ends the pool and removes its files now, not when collected
        for task, done in done_tasks:
            n_tasks += 1
            path = task.file.path
            if previous is not None and previous.path != path:
                progress.advance(nbytes=previous.size - credited[previous.path])
                credited[previous.path] = previous.size
            previous = task.file
            span = task.stop - task.start if isinstance(task, RangeTask) else 0
            credited[path] += span
            out.add(task, done, lines[path])
            lines[path] += done.lines if not task.is_rows else done.docs.num_rows + len(done.bad)
            blank += done.blank
            records[path] += done.docs.num_rows + len(done.bad)
            progress.advance(done.docs.num_rows + len(done.bad), span)
    if previous is not None:
        progress.advance(nbytes=previous.size - credited[previous.path])
    out.close()
    quarantined = sum(out.reasons.values())
    damaged = [DamagedFile.model_validate(d) for d in out.damaged]
    return RawDocumentsReport(
        input=out.kept + quarantined,
        documents=out.kept,
        quarantined=quarantined,
        quarantine_reasons=dict(sorted(out.reasons.items())),
        files=len(files),
        bytes=sum(f.size for f in files),  # of the input files: the throughput `curate profile` shows
        damaged_files=damaged,
        unread_bytes=sum(d.unread_bytes + d.partial_bytes for d in damaged),
        ignored_files=len(ignored),
        ignored_examples=ignored[:IGNORED_SHOWN],
        empty_files=sum(1 for f in files if records[f.path] == 0),
        tasks=n_tasks,
        blank_lines=blank,
        chars=out.chars,
    )
