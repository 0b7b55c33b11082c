"""The warm pool of ``curate run`` (``mode="in_process"``): worker processes forked from a fork
server with the programs imported, started once per run and reused by every step, each
partition's kernels on its share of the cores and memory (``PartitionPool``); and the run's head
start, its first program's partitions started before it imports Dagster (``ahead_of_run``: for
a crawl of one source, on one worker forked from the command's own process, which runs the steps
after it too, down the chain)."""

from __future__ import annotations

import gc
import itertools
import math
import multiprocessing
import os
import posixpath
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curation_dagster.run import values
from curation_dagster.run.done import Done
from curation_dagster.run.forkserver import start as start_fork_server
from curation_dagster.run.judge import Judge
from curation_dagster.run.partition import finish, one_line, step_judge
from curation_dagster.run.place import Curation, Place
from stages.catalog import PROGRAMS, step_after, waves
from stages.parallel import adopt_environment, die_with_parent, limit_threads, usable_cores
from stages.params import ExecutionParams
from stages.spec import CrawlSpec, adopt_keys, keys_held
from stages.store import PublishFailed, Store, commits_together

if TYPE_CHECKING:
    from curation_dagster.defs.resources import CurationResource

DIED = "its worker process died (out of memory?)"
_LINES_S = 0.5  # how often a partition's progress lines are passed on while it runs
_PACK = 16  # the most partitions a pack takes (``_pack_size``)
_PACK_S = 0.25  # the seconds of work a pack is sized to, at most (``_pack_size``)
_PACK_LEAST_S = 0.025  # the seconds of work a pack holds at least, where it can (``_pack_size``)
_GATHER_S = 0.1  # the longest a list of finished partitions waits for more (``PartitionPool.run``)
_AHEAD_S = 1.0  # the work a worker is handed ahead of what it runs, about (``PartitionPool.run``)
# Partitions run ahead are handed to their step while the cores are not all this run's, or once
# held this long (``_Hold``); while held, whether they still are is looked at this often. The
# workers are contended where, over the last look's window (at least ``_CONTENDED_WINDOW_S``), they
# waited for a core this share of the time, together (``_Hold.contended``); that verdict is kept
# for the holds that begin within ``_CONTENDED_KEPT_S`` of it.
_HOLD_S = 3.0
_HOLD_POLL_S = 0.02
_CONTENDED = 0.2
_CONTENDED_WINDOW_S = 0.1
_CONTENDED_KEPT_S = 0.5  # a hold that begins this soon after a contended window holds nothing
_FREE_S = 0.05  # a core free of the workers' packs this long lets what is held go
# A worker's resident memory grown by this much since its last release (or its start) is given
# back after the partition (``_release``); less is kept for the next partition to reuse.
_RELEASE_BYTES = 32 << 20
# A worker's place (workdir and data root: ``run/place``), store and crawl, set by the pool's
# initializer; its step's evaluator.
_WORKER: dict[str, Any] = {}
_STEPS = itertools.count()


def _init_worker(place: Place, spec: CrawlSpec, environ: dict[str, str], lines: Any,
                 keys: tuple[str, dict[tuple[str, str | None], str]]) -> None:
    die_with_parent(os.getppid())  # the fork server: it exits when the process that started it does
    _WORKER["lines"] = lines
    adopt_keys(*keys)  # the pool's, for as long as they hold (``stages.spec.adopt_keys``)
    values.defer()  # no Dagster here: its metadata values are made where they are recorded
    try:
        # The fork server's environment is that of the first pool of this process: take this one's.
        adopt_environment(environ)
        _WORKER.update(resource=place, store=place.store(), spec=spec)
    except Exception as exc:
        _WORKER["error"] = f"the worker process could not start: {one_line(exc)}"
    # What the fork server imported lives as long as the worker: out of the cyclic collector's
    # reach, so its full collections no longer walk Dagster's and the programs' modules (0.33-0.38
    # s of each worker's CPU in five collections at 200 sources).
    gc.freeze()
    _WORKER["resident"] = _resident_bytes()


def _work(program: str, sources: list[str | None], execution: ExecutionParams, force: bool, step: int,
          tell: bool = False) -> list[Done]:
    """A pack of partitions on this worker, in turn (one each where it is alone); ``tell``: its
    progress lines to the pool's process, as they come (``PartitionPool.run``)."""
    if "error" in _WORKER:
        return [Done(program, source, error=_WORKER["error"]) for source in sources]
    cores = execution.resolved_workers()
    # For the libraries a partition loads (torch's OpenMP, a BLAS not loaded yet); numpy's and
    # scipy's OpenBLAS were loaded in the fork server, with its thread count (run/worker_imports).
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(cores)
    limit_threads(cores)
    # One evaluator per step in each worker, made at its first partition of the step: reading
    # curate.yaml and the crawl's record for every partition was a third of a small one's time.
    held = _WORKER.get("judge")
    if held is None or held[0] != step:
        held = _WORKER["judge"] = (step, step_judge(_WORKER["resource"], _WORKER["spec"].crawl))
    emit = _WORKER["lines"].put if tell else None
    return run_pack(_WORKER["resource"], _WORKER["store"], _WORKER["spec"], program, sources, execution, force,
                    emit, held[1], _release)


def run_pack(resource: Curation, store: Store, spec: CrawlSpec, program: str, sources: list[str | None],
             execution: ExecutionParams, force: bool, emit: Callable[[str], None] | None, judge: Judge | None,
             after_each: Callable[[], None] | None = None) -> list[Done]:
    """A pack of partitions run in turn in this process and described (``finish``), their commits
    published together at its end (``stages.store.commits_together``: one durability point for
    them all, where each partition's fsyncs cost ~2 ms here) and the crawl's keys derived once
    for it (``keys_held``: checking that adopted keys still hold validates every program's
    params, 0.3 ms a partition; a model file changed while a pack runs re-keys from the next
    pack, as the step was planned with the keys of its start). ``after_each``: called after
    each partition. A partition whose commit was not published (``PublishFailed``) fails."""
    finished: list[tuple[Done, float]] = []  # each partition's end, and when it ended
    failed: PublishFailed | None = None
    trace = ""
    try:
        with keys_held(), (commits_together(store) if len(sources) > 1 else nullcontext()):
            for source in sources:
                try:
                    finished.append((finish(resource, store, spec, program, source, execution, force, emit,
                                            judge=judge), time.perf_counter()))
                finally:
                    if after_each is not None:
                        after_each()
    except PublishFailed as exc:  # raised once every partition ran: those it names fail, the others are committed
        failed, trace = exc, traceback.format_exc()
    end = time.perf_counter()
    out = []
    for done, at in finished:
        if done.outcome is None:
            out.append(done)
        elif failed is not None and any(done.outcome.manifest is m for m in failed.unpublished):
            out.append(Done(program, done.source, error=f"its commit failed: {one_line(failed)}", trace=trace))
        else:  # a partition's time waiting for the rest of its pack is outside its program
            out.append(replace(done, busy=done.busy + end - at))
    return out


def _clean(done: list[Done]) -> bool:
    """None of these partitions failed, and none failed a blocking check."""
    return all(d.outcome is not None and not d.blocking_failures() for d in done)


class _Ahead:
    """One program's partitions run ahead of its step (``PartitionPool.run_ahead``): the lists of
    those finished, as its thread gathers them (None once all have), and the progress lines they
    told."""

    def __init__(self, sources: list[str | None]) -> None:
        self.sources = sources
        self.lists: queue.SimpleQueue[list[Done] | BaseException | None] = queue.SimpleQueue()
        self.lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._ended = False
        self._taken = 0  # partitions taken so far
        self._failed: BaseException | None = None

    def take(self, timeout: float) -> list[Done] | None:
        """Those finished since the last take, in one list (empty where none finished within
        ``timeout`` seconds), else None once every partition is taken. A failure of the thread
        itself is raised here, once what finished before it is taken."""
        if self._failed is not None:
            raise self._failed
        if self._ended:
            return None
        got: list[Done] = []
        try:
            item = self.lists.get(timeout=timeout)
            while True:
                if item is None:
                    self._ended = True
                    break
                if isinstance(item, BaseException):
                    self._failed = item
                    break
                got += item
                self._taken += len(item)
                item = self.lists.get_nowait()
        except queue.Empty:
            pass
        if self._failed is not None and not got:
            raise self._failed
        return got if got or not self._ended else None

    @property
    def ended(self) -> bool:
        """Every partition is taken (each ends in one ``Done``, failed or not; the thread's own
        failure ends it too)."""
        return self._ended or self._taken >= len(self.sources)

    def told(self) -> list[str]:
        """The progress lines told since the last call."""
        out = []
        while not self.lines.empty():
            out.append(self.lines.get())
        return out


class _Pace:
    """The mean seconds a partition of one step has taken so far (its program's, ``Outcome.seconds``)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def add(self, done: list[Done]) -> None:
        for d in done:
            if d.outcome is not None and not d.outcome.skipped:
                self.total += d.outcome.seconds
                self.count += 1

    @property
    def seconds(self) -> float | None:
        return self.total / self.count if self.count else None


def _resident_bytes() -> int | None:
    """This process's resident memory in bytes (Linux's ``/proc/self/statm``); None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _release() -> None:
    """Give the memory a finished partition freed back to the OS, where the worker's resident
    memory grew by ``_RELEASE_BYTES`` or more since its last release (or its start; always where
    that is not known). Arrow's pool (jemalloc, ``stages._arrow_allocator``; mimalloc when these
    figures were taken) and glibc's heap keep it otherwise, and an idle worker then holds its last
    partition's peak while a crawl-wide step runs beside it (on another worker, or in the parent):
    1M documents, 4 sources, fuzzy: peak PSS of the process tree 1.48-1.52 → 1.23-1.31 GiB, wall
    time unchanged (docs/profile.md). Not after a small partition: the next one would fault its
    buffers in again (a 0.35 MB ``raw_documents`` partition: 145-290 page faults, up to 1.5 ms of
    its 5-7, short and long documents, JSONL and Parquet)."""
    import ctypes

    import pyarrow as pa

    now, before = _resident_bytes(), _WORKER.get("resident")
    if now is not None and before is not None and now - before < _RELEASE_BYTES:
        return
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    _WORKER["resident"] = _resident_bytes()


def _memory_bytes() -> int | None:
    """Memory available now: Linux's ``MemAvailable``, at most what this process's cgroup (v2: a
    container's limit) has left; None where neither is known."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as fh:
            found += [int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:")]
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(min(found), 0) if found else None


def _waited_s(pids: list[int]) -> float | None:
    """Seconds the main threads of processes ``pids`` have waited, runnable, for a core
    (``/proc/PID/schedstat``'s second figure, in ns), together; None where that is not known (not
    Linux, a process gone)."""
    total = 0
    try:
        for pid in pids:
            with open(f"/proc/{pid}/schedstat", "rb") as fh:
                total += int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


class _Hold:
    """Partitions that ran ahead, finished and taken, held back from their step while the
    workers' packs fill the cores (``PartitionPool._full``; a core free for less than ``_FREE_S``
    is a step's end handing over the next, which a burst of recording here slowed by 0.1-0.2 s:
    its threads wait for the interpreter at each of their calls) and the workers have the cores to
    themselves (not ``contended``), for at most ``_HOLD_S`` (``PartitionPool.run``).

    Why: recording a partition takes the run's process ~1-2 ms of a core (200 sources: ~1 s of
    CPU for 600 partitions); taken while the workers fill the cores, it is taken from them
    (three runnable processes on two cores). The steps down the chain then leave a core idle
    (``lsh_buckets``, ``duplicate_components``, the ledger: crawl-wide partitions, partly on one
    thread), and what was held is recorded then: 200 sources on two cores, 0.4 s less of a 4-6
    s crawl (docs/profile.md, seventh session of 2026-12-07). Where another program takes cores
    too, holding back would only give it this run's share: the workers' waits for a core
    (``_waited_s``) tell, over a hold's first 0.1 s, and what is held goes then (and the holds
    that begin within ``_CONTENDED_KEPT_S`` hold nothing). Unlike running this thread at a lower
    priority (docs/profile.md, eighth session of 2026-12-06), nothing else can starve it."""

    def __init__(self, pool: PartitionPool) -> None:
        self.pool = pool
        self.done: list[Done] = []
        self.since = 0.0  # when the first of ``done`` was taken
        self._mark: tuple[float, float] | None = None  # (when, the workers' waits then)
        self._contended = False  # the last window's verdict
        self._free_since: float | None = None  # since when the workers' packs have not filled the cores

    def add(self, done: list[Done]) -> None:
        if done and not self.done:  # a hold begins: the workers' waits are looked at afresh (before
            # it, this process's recording made them wait too), unless a window just now was contended
            self.since = time.monotonic()
            seen = self.pool._contended_at
            self._mark, self._contended = None, seen is not None and self.since - seen < _CONTENDED_KEPT_S
        self.done += done

    def take(self) -> list[Done]:
        """What is held, now no longer."""
        done, self.done = self.done, []
        return done

    def holds(self) -> bool:
        """Whether what is held waits on."""
        if not self.done or time.monotonic() - self.since >= _HOLD_S:
            return False
        if self.pool._full():
            self._free_since = None
        else:
            now = time.monotonic()
            if self._free_since is None:
                self._free_since = now
            if now - self._free_since >= _FREE_S:
                return False
        return not self.contended()

    def contended(self) -> bool:
        """Whether the workers waited for a core ``_CONTENDED`` of the time or more, together,
        over the last window of at least ``_CONTENDED_WINDOW_S`` this hold has seen (before its
        first: not known, no); where their waits cannot be read, yes (nothing is held)."""
        now = time.monotonic()
        if self._mark is not None and now - self._mark[0] < _CONTENDED_WINDOW_S:
            return self._contended  # within a window: not read again
        pids = self.pool._worker_pids()
        waited = _waited_s(pids) if pids else None
        if waited is None:
            return True
        if self._mark is not None:
            at, before = self._mark
            self._contended = (waited - before) / (now - at) >= _CONTENDED * len(pids)
            if self._contended:
                self.pool._contended_at = now
        self._mark = (now, waited)
        return self._contended


class PartitionPool:
    """Worker processes that run partitions of one crawl side by side, started once per
    ``curate run`` and reused by every step: ``workers`` processes at most (the execution
    settings' workers, else the cores this process may use, at most one per source). A step of k
    partitions runs at most as many at once as the memory available when the pool started holds
    of its program's requested memory (``Program.resources.memory_gib``: one at a time, in this
    process, where that is under two), and gives each ``cores // (partitions at once)`` cores:
    its ``ExecutionParams.workers`` (its process pools), its numba, torch and OpenMP threads. A
    step of one partition (a crawl-wide program's) runs it on a worker with every core, where the
    pool has a worker per core (``side_by_side``).
    Short partitions go to a worker in packs (``_pack_size``: about ``_PACK_S`` of work, and no
    less than ``_PACK_LEAST_S`` where it can; run here, in packs of the same size down to one),
    each pack's commits published together (``run_pack``).
    Finished partitions are handed to the step in lists, gathered for up to ``_GATHER_S``.
    ``warm``: start the fork server and a first worker at once (``curate run``'s pool, for the
    whole run), not when the first partitions are handed over. A step's partitions may be
    started before the step asks for them (``run_ahead``: ``curate run``'s head start,
    ``ahead_of_run``)."""

    def __init__(self, resource: CurationResource | Place, spec: CrawlSpec, force: bool = False, warm: bool = False,
                 execution: ExecutionParams | None = None, fork: bool = False) -> None:
        """``resource``: the ``curation`` resource, or its ``Place`` and ``execution`` settings
        (``curate run`` before it imports Dagster: ``ahead_of_run``). ``fork``: where the crawl
        has one source, one worker forked from this process now, for what runs ahead: the head
        start and the steps chained after it (``ahead_of_run``, ``_forked_fits``: this process has
        no other thread yet and has run no kernel)."""
        if isinstance(resource, Place):
            assert execution is not None, "a Place comes with its execution settings"
            self.resource, self.execution, mode = resource, execution, "in_process"
        else:
            self.resource, self.execution, mode = resource.place(), resource.execution(), resource.mode
        self.spec = spec
        self.force = force
        self.store: Store = self.resource.store()
        self.cores = self.execution.workers or usable_cores()
        self.workers = min(self.cores, len(spec.sources))
        self.memory = _memory_bytes()
        self._pool: ProcessPoolExecutor | None = None
        self._lines: Any = None  # a SimpleQueue of the workers' progress lines
        self._ahead: dict[str, _Ahead] = {}  # by program, until its step asks for them
        # ``then_ahead``: by the program that ends first, whether all of a later step will run
        self._then: dict[str, Callable[[str], bool]] = {}
        self._threads: list[threading.Thread] = []  # those that ran partitions ahead
        # The threads that run partitions ahead start the next step's (``_then_start``) while this
        # process's run takes what they finished: what they share changes under this lock.
        self._lock = threading.RLock()
        self._stopped = False  # ``stop_ahead``: no further step starts ahead
        self._handed: set[Future[list[Done]]] = set()  # packs handed to the workers, every step's (``_busy``)
        self._here = usable_cores()  # the cores this process may use (``_full``)
        self._contended_at: float | None = None  # when a hold last found the workers contended (``_Hold``)
        self.ahead: frozenset[tuple[str, str | None]] = frozenset()  # the partitions run ahead (``run_ahead``)
        # A worker forked from this process runs what runs ahead (the head start and the steps
        # chained after it: ``_forked_fits``), and a step that does not runs here. Forked only
        # where no other thread runs here now (one could hold a lock the child would inherit).
        self._ahead_only = fork and self.workers == 1 and self.cores >= 2 and threading.active_count() == 1
        if (self.workers >= 2 or self._ahead_only) and self.execution.executor == "local" and mode == "in_process":
            context: multiprocessing.context.BaseContext
            if self._ahead_only:
                context = multiprocessing.get_context("fork")
            else:
                # Workers are forked from a fork server, a fresh process with the programs
                # imported: not from this one, whose kernels may have started OpenMP threads
                # (fork is unsafe then).
                start_fork_server()  # where ``curate run`` has not already
                context = multiprocessing.get_context("forkserver")
            # A partition's progress lines, where it runs alone (``run``): written whole before
            # its result, so read here once it is done, none is left behind.
            self._lines = context.SimpleQueue()
            # The data root and its options as resolved here, whatever the workers' environment.
            self._pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_init_worker,
                                             initargs=(self.resource, spec, dict(os.environ), self._lines,
                                                       spec.derived_keys()))
            if warm or self._ahead_only:  # ``curate run``'s pool, for the whole run: start the fork
                # server (its imports take a second or two) and a first worker now, on another core
                # while this process starts the run and plans its first step (a step's own pool may
                # never be used); a forked worker now, before the executor starts its thread here
                self._pool.submit(os.getpid)

    @classmethod
    def ahead_of_run(cls, place: Place, execution: ExecutionParams, spec: CrawlSpec, force: bool,
                     fork: bool = False) -> PartitionPool | None:
        """``curate run``'s pool with its first step's partitions started now, before this process
        imports Dagster and opens the instance (1.0-1.5 s of one core), where every one of them is
        sure to run: the crawl's first run (none of its first program's partitions committed for its
        parameters now) or a forced one, on two cores or more and no Ray. None otherwise: the
        run's pool is made when its run starts, as before. What they commit is not recorded yet,
        so the run's planner finds it stale and its step records it (``Planner.current``), unless
        the instance recorded that very data version before (the same output, current). A crawl
        of one source runs ahead only with ``fork`` (this process is the command's own, fresh: its
        worker is forked from it, and runs the later steps too, down the chain: ``_forked_fits``),
        not with ``--backend gpu`` (whose check started CUDA's runtime here). The pool serves one
        run."""
        program = waves()[0][0]
        if execution.executor != "local" or usable_cores() < 2 or \
                (len(spec.sources) < 2 and (not fork or execution.backend == "gpu")):
            return None
        pool = None
        try:
            if not force and begun(place, spec, program):
                return None
            # Not warmed: a worker's start from the fork server waits for its imports, which the
            # thread that hands the partitions over waits for, not this process (``run_ahead``).
            pool = cls(place, spec, force, execution=execution, fork=fork)
            pool.then_ahead(program)  # and the steps after it, down the chain
            pool.run_ahead(program, spec.partitions(program))
        except BaseException as exc:  # only a head start: what failed here fails where it would have, in the run
            if pool is not None:
                pool.close()
            if not isinstance(exc, Exception):
                raise
            return None
        if not pool.ahead:
            pool.close()
            return None
        return pool

    def close(self) -> None:
        """End the workers once what they run now ends (what was only handed over is not run,
        unless a thread running partitions ahead waits on it: then it is), and those threads."""
        self.stop_ahead()  # no thread starts the next step's partitions from now on
        if self._pool is not None:
            # A thread running partitions ahead waits on what it handed over, and a cancelled
            # future wakes no waiter (``Future.cancel``): that work runs to its end instead (about
            # ``_AHEAD_S`` a worker); the thread's next hand-over fails on the shut pool, and it ends.
            self._pool.shutdown(wait=True, cancel_futures=not any(t.is_alive() for t in self._threads))
            for thread in self._threads:
                thread.join()
            self._ahead.clear()
            self._pool = None
            self._lines.close()

    def __enter__(self) -> PartitionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pass_lines(self, emit: Callable[[str], None] | None) -> None:
        """The progress lines the workers have written so far, to ``emit`` (None: dropped)."""
        while not self._lines.empty():
            line = self._lines.get()
            if emit is not None:
                emit(line)

    def side_by_side(self, program: str, partitions: int) -> int:
        """How many partitions of ``program`` run at once on the pool (0: here, in turn). One
        alone (a crawl-wide program's) runs on the pool too, with every core, where the pool has
        a worker per core: its worker has the programs imported and their kernels loaded, which
        this process would do first (0.3-0.5 s of the run's critical path for each of
        ``exact_duplicates`` and ``lsh_buckets`` at 200 sources). There it starts OpenMP's
        threads in that worker (numba's kernels), and a process the worker forks later must not
        run an OpenMP kernel (GNU OpenMP is not fork-safe): in a pool with a worker per core, the
        source partitions of the later steps get one core each and fork nothing; in a narrower
        one they fork pools of their own, so it runs here. What the program's requests allow:
        ``_fit``. A pool of one worker forked from this process (``fork``) runs nothing but what
        ran ahead: 0."""
        if self._pool is None or self._ahead_only or not partitions:
            return 0
        if partitions == 1 and self.workers < self.cores:
            return 0
        fit = self._fit(program)
        return min(fit, partitions) if fit >= min(partitions, 2) else 0

    def _fit(self, program: str) -> int:
        """How many of ``program``'s partitions the workers may run side by side as far as its
        requests go: none for a GPU program unless the backend is the CPU (its partitions run in the
        process that records them); else as many as the memory available when the pool started
        holds of its memory request."""
        resources = PROGRAMS[program].resources
        if resources.gpu > 0 and self.execution.backend != "cpu":
            return 0
        if self.memory is None:
            return self.workers
        return min(self.workers, int(self.memory // (max(resources.memory_gib, 0.25) * 2**30)))

    def _forked_fits(self, program: str) -> bool:
        """Whether ``program``'s partition (a one-source crawl's: one a step) runs ahead, down
        the chain, on the worker forked from this process (``fork``), as it would run here: where
        its requests allow one (``_fit``). Each program's first-partition costs (its imports,
        numba's target: 0.9 s in all) are then paid on the worker while this process starts,
        not after (docs/profile.md, tenth session of 2026-12-06)."""
        return self._fit(program) >= 1

    def run_ahead(self, program: str, sources: list[str | None]) -> None:
        """Start ``program``'s ``sources`` on the workers now, before its step asks for them
        (``run``): a thread of this process hands them over and gathers what finishes, as ``run``
        does, while this process goes on (``ahead_of_run``); on a worker forked from this process
        (``fork``), one partition at a time. Where ``sources`` are every partition of ``program``,
        what ``then_ahead`` asked for after it starts from that thread as they end."""
        whole = set(sources) == set(self.spec.partitions(program))
        with self._lock:
            if self._ahead_only:
                at_once = 1 if self._pool is not None else 0
            else:
                at_once = self.side_by_side(program, len(sources))
            if not sources or not at_once or program in self._ahead or self._stopped:
                return
            ahead = _Ahead(list(sources))
            self._ahead[program] = ahead
            self.ahead = self.ahead | {(program, s) for s in sources}

            def drive() -> None:
                try:
                    for done in self._run(program, ahead.sources, ahead.lines.put, None, at_once, then=whole):
                        ahead.lists.put(done)
                except BaseException as exc:  # handed to the step, which raises it (``run``)
                    ahead.lists.put(exc)
                finally:
                    ahead.lists.put(None)

            thread = threading.Thread(target=drive, name=f"{program}-ahead", daemon=True)
            self._threads.append(thread)
            thread.start()

    def then_ahead(self, program: str, ready: Callable[[str], bool] | None = None) -> None:
        """Start the next step's partitions (``run_ahead``: every partition of the program after
        ``program`` in the crawl's steps, ``waves``, past those switched off) as soon as every
        partition of ``program``'s next ``run`` has finished, none failed and none failed a blocking
        check, where they run on the workers and ``ready(step)`` says then that all of them will run
        (by default: a forced run, or none of them committed or begun for the crawl's keys,
        ``begun``); and so on down the steps, each started as the one before it ends clean. The
        workers run on while this process records what they finished, ends the step and plans the
        next: at 200 sources recording a partition takes this process ~2 ms. The caller vouches that
        ``program``'s run covers every partition of it (a step with none current: then the next step
        finds every partition of its own stale, the ones run ahead committed but not recorded, and
        so on), and that the steps run in that order."""
        with self._lock:
            self._then[program] = ready or self._all_will_run

    def _all_will_run(self, program: str) -> bool:
        """Whether every partition of ``program`` will run in this pool's run: it is forced, or
        none of them is committed or begun for the crawl's keys (``then_ahead``'s default)."""
        return self.force or not begun(self.resource, self.spec, program)

    def _then_start(self, program: str, clean: bool) -> None:
        """``program``'s run has every partition (``clean``: none failed, none failed a blocking
        check): start the next step's, where ``then_ahead`` asked for it and it is clean."""
        with self._lock:
            ready = self._then.pop(program, None)
            if ready is None or not clean or self._stopped:
                return
        after = step_after(program)
        while after is not None and self.spec.switched_off(after):  # a switched-off step runs nothing
            after = step_after(after)
        if after is None:
            return
        try:
            sources = self.spec.partitions(after)
            if (self._forked_fits(after) if self._ahead_only else self.side_by_side(after, len(sources))) \
                    and ready(after):
                self.then_ahead(after, ready)
                self.run_ahead(after, sources)
        except Exception:  # only a head start: ``after``'s step runs it, and fails where it would have
            return

    def _busy(self) -> int:
        """Packs handed to the workers, every step's, that have not ended: running or queued."""
        with self._lock:
            self._handed = {f for f in self._handed if not f.done()}
            return len(self._handed)

    def _full(self) -> bool:
        """Whether the workers' packs fill the cores this process may use: a pack running on
        each of them (fewer workers than cores, as ``workers: 2`` on 16, never do)."""
        return min(self._busy(), self.workers) >= self._here

    def _worker_pids(self) -> list[int]:
        """The worker processes' ids (none where the pool has none, or has not started them)."""
        processes = getattr(self._pool, "_processes", None)  # ProcessPoolExecutor's, by pid
        return list(processes or ())

    def stop_ahead(self) -> None:
        """Start no further step ahead (``then_ahead``): the run failed or was stopped. What was
        handed over runs to its end (``close``)."""
        with self._lock:
            self._stopped = True
            self._then.clear()

    def run(self, program: str, sources: list[str | None], emit: Callable[[str], None] | None = None,
            started: Callable[[set[str | None]], None] | None = None) -> Iterator[list[Done]]:
        """Every partition of ``program`` in ``sources``, as they finish: each list holds those
        finished since the last was taken (at least one); those started ahead (``run_ahead``)
        first, as they finish (held back while the workers fill the cores: ``_Hold``), with the
        progress lines they told meanwhile. ``started``: called once they are handed over, with
        those that had ended committed already (started ahead; else none): a step's planned
        materializations are for the others (a partition that failed is planned: Dagster counts
        a failed partition by its planned materialization with no materialization after it). A
        worker process that dies (the OOM killer) breaks the pool: every partition of the step
        not done by then fails, and so do later steps' (a rerun resumes). What ``then_ahead``
        asked for after ``program`` starts once all of these have finished, before the last list
        is yielded (where they ran ahead, from the thread that ran them: the steps after it may
        have started before this step began)."""
        try:
            with self._lock:
                ahead = self._ahead.pop(program, None)
            if ahead is None:
                yield from self._run(program, sources, emit, started, self.side_by_side(program, len(sources)),
                                     then=True)
                return
            wanted, ran = set(sources), set(ahead.sources)
            try:
                got = ahead.take(0.0)  # what ended before this step began: recorded first
            except BaseException:
                if started is not None:
                    started(set())
                raise
            if started is not None:  # handed over already; a failed one is planned (Dagster shows it failed)
                started({d.source for d in got or () if d.outcome is not None} & wanted)
            rest = [s for s in sources if s not in ran]
            clean = True
            held = _Hold(self)  # finished, not yet handed to the step
            while got is not None:
                for line in ahead.told():  # as they come, where one partition runs alone
                    if emit is not None:
                        emit(line)
                done = [d for d in got if d.source in wanted]
                clean = clean and _clean(done)
                if ahead.ended and not rest:  # the last: what comes next starts before it is recorded
                    self._then_start(program, clean)
                held.add(done)
                if held.done and not held.holds():
                    yield held.take()
                try:
                    got = ahead.take(_HOLD_POLL_S if held.done else _LINES_S)
                except BaseException:  # the thread failed: what it finished before goes to the step first
                    if held.done:
                        yield held.take()
                    raise
            # The step's last partitions too, while the steps after it keep the cores busy: the
            # step ends when they are recorded, and those steps run on meanwhile.
            while not rest and held.holds():
                time.sleep(_HOLD_POLL_S)
            if held.done:
                yield held.take()
            with self._lock:  # a worker forked from this process ends with the chain it runs
                done_with = self._ahead_only and not self._ahead
            if done_with:
                self.close()
            if rest:
                yield from self._run(program, rest, emit, None, self.side_by_side(program, len(rest)), then=True,
                                     clean=clean)
        finally:  # asked for, not started (a run in this process, a failure): not for a later run
            with self._lock:
                self._then.pop(program, None)

    def _run(self, program: str, sources: list[str | None], emit: Callable[[str], None] | None,
             started: Callable[[set[str | None]], None] | None, at_once: int, then: bool = False, clean: bool = True
             ) -> Iterator[list[Done]]:
        """``run``, ``at_once`` partitions side by side on the workers (0: here, in turn). ``then``:
        what ``then_ahead`` asked for after ``program`` starts before its last list is yielded
        (``clean``: none failed so far), where they run on the workers."""
        if not at_once:
            if started is not None:
                started(set())
            judge = step_judge(self.resource, self.spec.crawl) if sources else None
            pace, queue = _Pace(), list(sources)
            while queue:
                size = _pack_size(len(queue), 1, pace.seconds, least_s=0.0)  # no hand-over to wait for
                ran = run_pack(self.resource, self.store, self.spec, program, queue[:size], self.execution,
                               self.force, emit, judge)
                del queue[:size]
                pace.add(ran)
                yield ran
            return
        pool = self._pool
        assert pool is not None
        execution = self.execution.model_copy(update={"workers": max(1, self.cores // at_once)})
        # Where memory bounds the step (fewer side by side than workers), ``at_once`` packs at a
        # time; else each worker's queue holds about ``_AHEAD_S`` of work while this process
        # records (each pack sized when it is handed over, at the step's pace so far).
        bound = at_once < self.workers
        step = next(_STEPS)  # the workers' evaluators are per step
        # A partition alone tells its progress, as it did when it ran in this process.
        tell = at_once == 1 and emit is not None
        if tell:
            self._pass_lines(None)  # an abandoned partition's last lines: not this one's
        queue = list(sources)
        pace = _Pace()
        pending: dict[Future[list[Done]], list[str | None]] = {}

        def queued() -> float:
            """Seconds of work handed over beyond what the workers run now, a worker."""
            return (sum(map(len, pending.values())) - at_once) * (pace.seconds or 0.0) / at_once

        def hand_over() -> list[Done]:
            """Packs to the workers while they want more: one partition a worker until the first
            ends and sets the pace, then about ``_AHEAD_S`` queued a worker (``at_once`` packs
            where memory bounds the step); the partitions of a pool that broke, failed."""
            broken: list[Done] = []
            while queue and (len(pending) < at_once if bound or pace.seconds is None else queued() < _AHEAD_S):
                size = 1 if tell else _pack_size(len(queue), at_once, pace.seconds)
                pack = queue[:size]
                del queue[:size]
                try:
                    future = pool.submit(_work, program, pack, execution, self.force, step, tell)
                    pending[future] = pack
                    with self._lock:
                        self._handed.add(future)
                except BrokenProcessPool as exc:  # a worker died in an earlier step
                    broken += [Done(program, source, error=f"{DIED}: {one_line(exc)}") for source in pack]
            return broken

        broken = hand_over()
        if started is not None:  # handed over: the workers run them meanwhile
            started(set())
        if broken:
            clean = False
            yield broken
        taken = time.monotonic()
        while pending:
            finished, _ = wait(pending, timeout=_LINES_S if tell else None, return_when=FIRST_COMPLETED)
            if tell:
                self._pass_lines(emit)
            if not finished:
                continue
            # Those that finish within ``_GATHER_S`` of the last list join this one, where the
            # workers have that much queued meanwhile: a list is recorded in one batch, whose fixed
            # cost is most of a small partition's (200 sources, replayed, 1.78 ms a partition one
            # at a time, 0.82 ms sixteen at a time). A step's last list is taken when its last
            # partition ends: the wait ends when all have.
            since = time.monotonic() - taken
            if (not tell and since < _GATHER_S and len(finished) < len(pending)
                    and (not queue or (not bound and queued() >= _GATHER_S))):
                finished, _ = wait(pending, timeout=_GATHER_S - since, return_when=ALL_COMPLETED)
            taken = time.monotonic()
            done: list[Done] = []
            with self._lock:
                self._handed.difference_update(finished)
            for future in finished:
                pack = pending.pop(future)
                try:
                    done += future.result()
                except BrokenProcessPool as exc:
                    done += [Done(program, source, error=f"{DIED}: {one_line(exc)}") for source in pack]
                except Exception as exc:  # the worker's task itself failed (not a partition): its pack did
                    trace = "".join(traceback.format_exception(exc))
                    done += [Done(program, source, error=one_line(exc), trace=trace) for source in pack]
            pace.add(done)
            # More handed over before these are recorded: the workers never wait on that.
            more = hand_over()
            clean = clean and _clean(done) and not more
            if then and not pending and not queue:  # the last list: the next step's partitions start now
                self._then_start(program, clean)
            yield done + more


def begun(place: Place, spec: CrawlSpec, program: str) -> bool:
    """Whether any partition of ``program`` was committed or begun for the crawl's current keys:
    its folders (one, unless sources differ in their parameters) looked at once each, not once a
    partition. Where none was, every partition of it runs in the crawl's run."""
    root = place.dataroot()
    level = PROGRAMS[program].level
    with keys_held():  # the crawl's keys derived once, not once a source
        folders = {(root.output_dir(spec, program, s) if level == "crawl" else
                    posixpath.dirname(root.output_dir(spec, program, s)))
                   for s in spec.partitions(program)}
    return any(root.store.fs.exists(folder) for folder in folders)


def _pack_size(remaining: int, at_once: int, seconds: float | None, least_s: float = _PACK_LEAST_S) -> int:
    """How many of a step's ``remaining`` partitions the next pack takes: as many as run in about
    ``_PACK_S`` (``seconds``: the mean a partition of the step has taken so far; None before the
    first ends: one), at most ``_PACK``, and at most a quarter of what remains over the ``at_once``
    run side by side (guided self-scheduling: the last packs shrink, so no worker waits on another's
    long pack at a step's end), but not under ``least_s`` of work (0: packs run in this process). A
    pack handed to a worker waits for this process's executor thread, which shares the interpreter
    with the thread recording the step: 5-50 ms a pack at 200 sources, where a step of partitions of
    1-3 ms (a switched-off program's, when those ran) ended in 16 packs of one each, 80 ms of its
    240. A partition of more than half ``_PACK_S`` goes alone: its commit's fsyncs are a small part
    of it, and a pack would hold back its recording and lose more of what it did to a process that
    dies."""
    if seconds is None:
        return 1
    seconds = max(seconds, 1e-6)
    least = math.ceil(least_s / seconds)
    return max(1, min(_PACK, int(_PACK_S / seconds), max(remaining // (4 * at_once), least), remaining))
