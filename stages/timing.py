"""Where one partition's wall time goes: the store's reads, the partition writer's writes, the rest.

``stages.execute.execute`` opens a ``Clock`` around a partition (``measure``); the store adds the
seconds and bytes of every committed-data read to it (manifests, ``read_table``, each batch of
``iter_batches``) and the partition writer those of every part it writes. What is neither is
compute. Beside the wall time, the CPU seconds spent meanwhile (``cpu_s``: ``cpu_seconds``), so a
partition that waited for a core (side by side with other processes on too few) shows as one
whose CPU time is short of its wall time. The figures go into the partition's report
(``report["timing"]``, so they survive in the manifest whichever way the partition ran:
in-process, ``python -m stages``, a pod) and into its materialization's metadata as floats
(``figures``), which the Dagster UI plots across crawls.

Only the outermost timed call counts (a ``read_table`` that reads its manifest is one read), and
only in the context that opened the clock: reads in worker processes or helper threads (a
prefetching tokenizer) overlap compute and are not subtracted from it. Bytes are Arrow buffer
sizes (what a reader gets or a writer is given), not compressed file sizes.
"""

from __future__ import annotations

import functools
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, copy_context
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import Future

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
Kind = Literal["read", "write"]


def cpu_seconds() -> float:
    """CPU seconds (user and system) of this process, all its threads, and of its child processes
    waited for. Between a partition's start and end they are the partition's where its process
    runs nothing else (a pool worker of ``curate run``, a Pipes subprocess, a pod), its own local
    worker pools included (``stages.parallel`` waits for them as the partition ends); not the
    CPU of Ray tasks (other processes, not children); and, in a process that does other work
    meanwhile (``curate run``'s own, recording while it runs a partition), that work's too."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # os.times counts in 10 ms ticks
    return time.process_time() + children.ru_utime + children.ru_stime


@dataclass
class Clock:
    """Seconds and bytes of one partition's reads and writes, and when it started."""

    start: float = field(default_factory=time.perf_counter)
    cpu_start: float = field(default_factory=cpu_seconds)
    read_s: float = 0.0
    write_s: float = 0.0
    read_bytes: int = 0
    written_bytes: dict[str, int] = field(default_factory=dict)  # per output table
    _depth: int = 0

    def report(self) -> dict[str, Any]:
        """The ``timing`` entry of a report: wall (from ``start`` to now), read, write, compute
        (the rest) in seconds, the CPU seconds meanwhile (``cpu_seconds``: a process that runs one
        partition at a time, as a pool worker does, spent them on it), bytes read and bytes
        written per table."""
        wall = time.perf_counter() - self.start
        return {
            "wall_s": round(wall, 4), "cpu_s": round(cpu_seconds() - self.cpu_start, 4),
            "read_s": round(self.read_s, 4), "write_s": round(self.write_s, 4),
            "compute_s": round(max(wall - self.read_s - self.write_s, 0.0), 4),
            "read_bytes": self.read_bytes, "written_bytes": dict(sorted(self.written_bytes.items())),
        }


_CLOCK: ContextVar[Clock | None] = ContextVar("stages_timing_clock", default=None)


@contextmanager
def measure() -> Iterator[Clock]:
    """A fresh clock for the partition run inside this block (nested blocks get their own)."""
    clock = Clock()
    token = _CLOCK.set(clock)
    try:
        yield clock
    finally:
        _CLOCK.reset(token)


def clocked(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run inside ``measure()``: its reads and writes are counted on its own clock."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with measure():
            return fn(*args, **kwargs)

    return wrapper


@contextmanager
def helper_thread(name: str) -> Iterator[Callable[..., Future[Any]]]:
    """A helper thread while the block runs: ``submit(fn, *args, **kwargs)`` runs each call on it,
    in turn, in a copy of this context without its clock (what the partition holds: each manifest
    read once; a helper's reads overlap the partition's work, and the partition counts its own
    waits for them). Joined at the block's end."""
    from concurrent.futures import ThreadPoolExecutor

    ctx = copy_context()
    ctx.run(_CLOCK.set, None)
    with ThreadPoolExecutor(1, thread_name_prefix=name) as pool:

        def submit(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
            return pool.submit(ctx.run, fn, *args, **kwargs)

        yield submit


def timing_report() -> dict[str, Any]:
    """``Clock.report()`` of the current clock (an empty dict outside ``measure``)."""
    clock = _CLOCK.get()
    return {} if clock is None else clock.report()


@contextmanager
def timed(kind: Kind, nbytes: int = 0, table: str | None = None) -> Iterator[Clock | None]:
    """Add the block's seconds (and ``nbytes``; more via the yielded clock's fields) to the
    current clock's ``kind``; nothing without a clock or inside another timed block."""
    clock = _CLOCK.get()
    if clock is None or clock._depth:
        yield None
        return
    clock._depth += 1
    t0 = time.perf_counter()
    try:
        yield clock
    finally:
        clock._depth -= 1
        seconds = time.perf_counter() - t0
        if kind == "read":
            clock.read_s += seconds
            clock.read_bytes += nbytes
        else:
            clock.write_s += seconds
            if table is not None:
                clock.written_bytes[table] = clock.written_bytes.get(table, 0) + nbytes


def timed_iter(items: Iterator[T]) -> Iterator[T]:
    """``items`` with the time of producing each one (a batch read) counted as a read, and the
    Arrow size of each (a ``RecordBatch``) as bytes read; the consumer's time in between is not."""
    while True:
        with timed("read") as clock:
            try:
                item = next(items)
            except StopIteration:
                return
            if clock is not None:
                clock.read_bytes += int(getattr(item, "nbytes", 0))
        yield item


# Float metadata of a materialization: what the Dagster UI's Plots tab charts across crawls.
FIGURES = ("wall_s", "cpu_s", "read_s", "compute_s", "write_s")


def figures(report: dict[str, Any]) -> dict[str, float]:
    """``FIGURES`` of a report's ``timing`` (those it has: none before it had one, no ``cpu_s``
    before that was measured), as floats."""
    timing = report.get("timing")
    if not isinstance(timing, dict):
        return {}
    return {name: float(timing[name]) for name in FIGURES if name in timing}
