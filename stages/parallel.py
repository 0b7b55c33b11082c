"""Run one function over many work items, in order, on this machine or on a Ray cluster.

Programs that fan out (scoring, signatures, ingestion of file pieces, LSH band groups) call
``map_ordered``; the executor is an execution setting (``ExecutionParams.executor``), never a
parameter, so the output is identical whichever runs it. Results come back in input order with a
bounded number of items in flight, so memory stays flat however many items there are.

``num_cpus`` is what one call uses, on both executors: locally ``workers // num_cpus`` calls run
side by side (inline when that is 1); on Ray each task reserves ``num_cpus`` and its numba
kernels run on that many threads (``numba.set_num_threads``), so tasks never oversubscribe a node.
Ray is imported only by the Ray executor.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, NoReturn, TypedDict, TypeVar

if TYPE_CHECKING:  # pydantic's import (0.1 s) kept off the console script's way to the fork server
    from concurrent.futures import Executor, Future

    from stages.params import ExecutionParams

T = TypeVar("T")
R = TypeVar("R")


def usable_cores() -> int:
    """The cores this process may run on (its affinity, e.g. a container's CPU set)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def map_ordered(
    fn: Callable[[T], R], items: Iterable[T], execution: ExecutionParams, *, num_cpus: float = 1.0,
    num_gpus: float = 0.0, threads: bool = False,
) -> Iterator[R]:
    """``fn(item)`` for every item, yielded in input order.

    ``executor="local"``: a process pool of ``resolved_workers() // num_cpus`` processes (inline
    when 1), or as many threads with ``threads`` (for a ``fn`` whose work releases the GIL: Arrow's
    reads, numpy's sorts; no fork, and no result pickled back); ``executor="ray"``: Ray tasks with
    the declared ``num_cpus``/``num_gpus`` on the cluster at ``ray_address`` (started on this
    machine when None). ``fn`` must be picklable: a module-level function, or an instance of a
    module-level class (e.g. holding parameters).
    """
    if execution.executor == "ray":
        yield from _ray_map(fn, items, execution, num_cpus, num_gpus)
        return
    workers = max(1, int(execution.resolved_workers() // max(num_cpus, 1.0)))
    if workers <= 1:
        yield from map(fn, items)
        return
    if threads:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as threaded:
            yield from _bounded(threaded, fn, items, workers)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    preload()  # before the fork: pyarrow's pandas shim settled once, here, not in each worker
    # Forked, whatever this process's default: in a process started by a fork server (a worker of
    # ``curate run``'s pool) the default is the fork server's, whose children are not this
    # process's, so ``die_with_parent`` ended each at once and the pool broke. A forked child must
    # not run an OpenMP kernel where this process has run one (GNU OpenMP is not fork-safe): a
    # program whose calls run a multi-threaded kernel takes ``kernel_cpus`` and runs them here.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_forked,
                             initargs=(os.getpid(), max(1, int(num_cpus)))) as pool:
        yield from _bounded(pool, fn, items, workers)


def _bounded(pool: Executor, fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """``fn(item)`` on ``pool`` in input order, at most ``2 * workers`` items in flight; those not
    started are dropped when one fails (or the caller stops), not run before the error is told."""
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()


def preload() -> None:
    """Settle pyarrow's pandas shim in this process, before it forks workers, without importing
    pandas (where nothing has): at a process's first conversion of Python objects (``pa.array`` of a
    list, ``pa.scalar``, ``pc.fill_null(x, False)``) pyarrow imports pandas to tell its objects
    apart, 0.25 s of CPU, in the fork server of ``curate run``'s pool (its one preload, beside the
    command's own imports on the way to the first partition) or in each worker. No program uses
    pandas: the shim is told there is none (its one try refused, in this thread alone:
    ``_NoPandasHere``), and told otherwise once pandas is imported after all (``_PandasAfterAll``),
    so a plug-in's pandas objects are converted as pandas objects; ``to_pandas`` and
    ``from_pandas`` import it themselves as ever. Once a process: a later call finds the shim
    settled."""
    try:
        import pyarrow as pa
    except ImportError:
        return
    if any(isinstance(f, _PandasAfterAll) for f in sys.meta_path):
        return
    if "pandas" in sys.modules:
        pa.array([None])  # the shim set up now, not in each worker's first partition
        return
    refuse = _NoPandasHere()
    # sys.meta_path rebound, never changed in place: another thread's import may be walking it.
    sys.meta_path = [refuse, *sys.meta_path]
    try:
        pa.array([None])  # the shim's one try: refused, and remembered
    finally:
        sys.meta_path = [f for f in sys.meta_path if f is not refuse]
    if "pandas" in sys.modules:  # another thread imported it meanwhile
        _tell_pyarrow()
    else:
        sys.meta_path = [_PandasAfterAll(), *sys.meta_path]


def _tell_pyarrow() -> None:
    """pyarrow's pandas shim told that pandas is imported (its ``pd`` retries the import)."""
    with suppress(Exception):  # a pyarrow without this shim: nothing to tell
        import pyarrow.lib

        pyarrow.lib._pandas_api.pd  # noqa: B018


class _NoPandasHere:
    """A ``sys.meta_path`` finder that fails the import of pandas in the thread that made it
    (``preload``, while pyarrow's shim makes its one try); other threads' are not touched."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" and threading.get_ident() == self.thread:
            raise ModuleNotFoundError("pandas is not imported here (stages.parallel.preload)", name=name)


class _PandasAfterAll:
    """A ``sys.meta_path`` finder, first in the list, that watches for pandas: it finds pandas as
    the finders after it would and, once pandas' module has run, tells pyarrow's shim
    (``_tell_pyarrow``) and leaves the list. A look-up alone (``importlib.util.find_spec``, "is
    pandas installed?") runs no module, and it stays."""

    def __init__(self) -> None:
        self._finding = threading.local()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "pandas" or getattr(self._finding, "on", False):
            return None
        import importlib.util

        self._finding.on = True  # the finders after this one: importlib asks this one again
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding.on = False
        run = getattr(spec.loader, "exec_module", None) if spec is not None else None
        if run is None:
            return spec

        def exec_module(module: Any) -> None:
            run(module)
            sys.meta_path = [f for f in sys.meta_path if f is not self]
            _tell_pyarrow()

        with suppress(AttributeError, TypeError):  # a loader that takes no attribute: pyarrow not told
            spec.loader.exec_module = exec_module  # type: ignore[union-attr,method-assign]
        return spec


def load_kernel_target() -> None:
    """Load numba's CPU target with its implementations here, as a process's first kernel from
    numba's cache would (0.28-0.34 s): in a process that forks workers that all run kernels (the
    warm pool's fork server, ``curation_dagster.run.worker_imports``), once for all of them."""
    try:  # numba's internals (0.68): a numba without them loads its target at the first kernel, as before
        from numba.core.registry import cpu_target

        cpu_target.target_context.refresh()
    except Exception:  # the fork server dies on its preload's errors (but ImportError): never for a head start
        pass


def _forked(parent: int, cores: int) -> None:
    """A worker forked by ``map_ordered``: it dies with ``parent`` (``die_with_parent``) and
    decodes Parquet as a process of ``cores`` cores does (``arrow_threads``), not as its parent
    (every core of the partition); numba's threads stay as forked (a forked child must not start
    OpenMP's)."""
    global _CORES
    die_with_parent(parent)
    _CORES = cores


def die_with_parent(parent: int) -> None:
    """Have this process killed (SIGKILL) when ``parent``, the process that started it, dies (SIGKILL,
    the OOM killer): a pool worker would wait forever on the pool's queue with its memory, a
    Pipes subprocess would go on writing a partition that its dead run's retry writes again."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


@contextmanager
def collector_paused(freeze: bool = False) -> Iterator[None]:
    """The cyclic garbage collector off for a block that imports much and makes few cycles
    (modules live as long as the process): each of its full collections walks every object the
    imports made so far. The console script's and ``curate run``'s imports (Dagster's among
    them), in a fresh process: 1.18-1.24 s with it, 0.96-1.06 s without. ``freeze``: what the
    process holds then is moved out of the collector's reach for good (``gc.freeze``) before it
    is on again, or its next collection walks all the block made (0.1 s after those imports);
    only where the process is the caller's own, since a frozen cycle is never freed. Where the
    collector was off already, it stays off."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was:
            gc.enable()


def exit_process(code: int) -> NoReturn:
    """End the process with ``code`` once its work is done, as the interpreter would, but without
    the interpreter's teardown: non-daemon threads are joined, atexit handlers run (Ray's shutdown,
    temporary folders, logging) and stdout/stderr flushed, then ``os._exit``. Native thread pools
    (Arrow's I/O and CPU pools, OpenMP, BLAS) may still hold Python objects; during teardown such
    a thread's wait for the GIL ends in ``std::terminate`` (exit 134 after the work was written,
    issue 30). Without the teardown the exit code is the command's outcome, always: ``curate``
    and ``python -m stages`` (a stage pod's command) end here."""
    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter calls first at exit
    if shutdown is not None:
        shutdown()
    else:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (curate ledger | head) or stream
            pass
    os._exit(code)


class CallResources(TypedDict, total=False):
    """What one call of a fanned-out function takes (``map_ordered``'s ``num_cpus``, ``num_gpus``)."""

    num_cpus: float
    num_gpus: float


def zip_results(
    items: Iterable[T], fn: Callable[[T], R], execution: ExecutionParams, *, num_cpus: float = 1.0,
    num_gpus: float = 0.0, threads: bool = False,
) -> Iterator[tuple[T, R]]:
    """(item, fn(item)) pairs in input order (items are kept until their result arrives); the
    keywords as ``map_ordered``'s."""
    held: deque[T] = deque()

    def remember(items: Iterable[T]) -> Iterator[T]:
        for item in items:
            held.append(item)
            yield item

    for result in map_ordered(fn, remember(items), execution, num_cpus=num_cpus, num_gpus=num_gpus,
                              threads=threads):
        yield held.popleft(), result


def kernel_cpus(execution: ExecutionParams) -> float:
    """Cores for one call of a multi-threaded (numba ``parallel=True``) kernel.

    Locally the whole machine: one batch at a time with the kernel's threads inside, so no batch
    is copied to another process. On Ray one core per task: the cluster's cores are the parallelism.
    """
    return 1.0 if execution.executor == "ray" else float(execution.resolved_workers())


# --- Ray ------------------------------------------------------------------------------------------


def ray_init(execution: ExecutionParams, **local: Any) -> Any:
    """The ``ray`` module, connected to ``execution.ray_address`` (``ray://host:10001``, ``auto``,
    ``host:6379``) or to a Ray instance started on this machine (``workers`` CPUs, 0: every core;
    ``local`` are more ``ray.init`` arguments for it, e.g. ``num_gpus``), unless this process is
    connected already. A local instance listens on 127.0.0.1 only."""
    address = execution.ray_address or os.environ.get("RAY_ADDRESS") or None
    if address is None or _is_loopback(address):
        # Ray binds every port to the node IP it resolves; on Linux that is the external
        # interface, unless this is "0" (read when ray is imported: set first, patch if imported).
        # A cluster on 127.0.0.1 is reachable only so: Ray would rewrite 127.0.0.1 to that IP.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    joining = address is not None and _token_auth_if_available()
    import ray

    if ray.is_initialized():
        return ray
    if address is None or _is_loopback(address):
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1"
    if address is None:
        # "local": a new instance even if `ray start` left a cluster on this machine, which
        # ray.init() would join otherwise.
        options = {"num_cpus": execution.workers or None, "include_dashboard": False, "log_to_driver": False,
                   **local}
        ray.init(address="local", ignore_reinit_error=True, **options)
    else:
        if joining:  # Ray reads the mode when it is imported: refresh it if that was earlier
            from ray._raylet import Config  # type: ignore[attr-defined]

            Config.initialize("")
        ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
    return ray


def _token_auth_if_available() -> bool:
    """Send the cluster's token when there is one: Ray >= 2.5x clusters enable token auth by
    default, but a driver joining one sends its token only with ``RAY_AUTH_MODE=token`` (a token
    sent to a cluster without auth is ignored). The token: ``RAY_AUTH_TOKEN``, the file
    ``RAY_AUTH_TOKEN_PATH``, or ``~/.ray/auth_token`` (where ``ray start`` writes it)."""
    if "RAY_AUTH_MODE" in os.environ:
        return False
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.exists(path):
        os.environ["RAY_AUTH_MODE"] = "token"
        return True
    return False


def _is_loopback(address: str) -> bool:
    """True for ``127.0.0.1:6379``, ``ray://localhost:10001`` and the like."""
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


def _ray_map(
    fn: Callable[[T], R], items: Iterable[T], execution: ExecutionParams, num_cpus: float, num_gpus: float
) -> Iterator[R]:
    ray = ray_init(execution)
    task = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(_run_task)
    total = ray.cluster_resources()
    slots = total.get("GPU", 0) / num_gpus if num_gpus else total.get("CPU", 1) / max(num_cpus, 1e-9)
    # An autoscaling cluster may have no worker yet: keep enough queued for it to scale up.
    in_flight = max(4, 2 * int(slots))
    fn_ref, conf = ray.put(fn), _storage_conf(ray)
    threads = _threads(num_cpus)
    pending: deque[Any] = deque()
    try:
        for item in items:
            pending.append(task.remote(fn_ref, item, threads, conf))
            if len(pending) >= in_flight:
                yield ray.get(pending.popleft())
        while pending:
            yield ray.get(pending.popleft())
    finally:
        for ref in pending:  # the consumer stopped early or a task failed: drop the rest
            ray.cancel(ref)


def _threads(num_cpus: float) -> int:
    return max(1, int(num_cpus))


def _storage_conf(ray: Any) -> Any:
    """fsspec's per-protocol defaults of this process (``stages.store.use_storage_options``)
    without their secrets (``stages.credentials.without_secrets``: endpoint and region travel,
    keys and tokens never enter the object store), put once in the object store, so tasks open
    source URLs the way the driver does."""
    import fsspec.config

    return ray.put(shared_storage_conf(fsspec.config.conf)) if fsspec.config.conf else None


def shared_storage_conf(conf: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What of fsspec's per-protocol defaults ``conf`` Ray tasks receive: no secret."""
    from stages.credentials import without_secrets

    return {protocol: without_secrets(options) for protocol, options in conf.items()}


def adopt_environment(environ: Mapping[str, str]) -> None:
    """This process's environment replaced by ``environ`` (a pool worker forked from a fork
    server that another environment started), and what loaded modules read of it: ``$TMPDIR``
    (spill space), numba's configuration."""
    import tempfile

    from numba.core import config

    os.environ.clear()
    os.environ.update(environ)
    tempfile.tempdir = None
    config.reload_config()


# The cores ``limit_threads`` last gave this process's kernels (None: never called, every core).
_CORES: int | None = None


def limit_threads(cores: int) -> None:
    """Kernels of this process on ``cores`` cores: numba's threads (a ``parallel=True`` kernel
    takes every core otherwise) and torch's, where torch is loaded; and whether Arrow decodes
    Parquet on its pool, only with more than one (``arrow_threads``; the pool keeps its size)."""
    import numba

    global _CORES
    numba.set_num_threads(max(1, min(cores, numba.config.NUMBA_NUM_THREADS)))  # type: ignore[attr-defined]
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(max(1, cores))
    _CORES = max(1, cores)


def arrow_threads() -> bool:
    """Whether this process's Parquet reads decode on Arrow's CPU pool (``use_threads``): where
    its kernels have more than one core (``limit_threads``; where it was never called, the cores
    it may run on). With one, the pool only adds a hand-over: the reading thread waits while a
    pool thread is woken to decode, and where the cores are shared (a pool worker beside the
    others and the run's own process) it waits for that thread's turn too. At 200 sources on 2
    cores, a source's Parquet file (390 short documents) took 0.93-1.38 ms of wall time to decode
    on the pool (the median of a crawl's partitions, three crawls; 0.18-0.22 ms of the reader's
    CPU), 0.63-0.97 ms on the reader (two crawls). Arrow's pool keeps its
    size: sized to one thread (``pyarrow.set_cpu_count``) it raised the peak PSS of a crawl of 1M
    documents from 880-1021 MiB (8 runs) to 1030-1161 (7), decoding on the reader or not."""
    return (_CORES if _CORES is not None else usable_cores()) > 1


def _worker_setup(threads: int, conf: dict[str, dict[str, Any]] | None) -> None:
    """In a Ray worker: kernels on the task's cores (``limit_threads``); the driver's fsspec
    defaults, with the worker's own ``$CURATE_STORAGE_OPTIONS`` over them (its credentials: from
    its environment, as a local instance inherits the driver's, or the cluster's Secret; else the
    AWS chain)."""
    limit_threads(threads)
    if conf:
        import fsspec.config

        from stages.credentials import storage_options

        own = storage_options()
        for protocol, options in conf.items():
            fsspec.config.conf.setdefault(protocol, {}).update({**options, **own})


def _run_task(fn: Callable[[T], R], item: T, threads: int, conf: dict[str, dict[str, Any]] | None) -> R:
    _worker_setup(threads, conf)
    return fn(item)
