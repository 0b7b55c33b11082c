"""Run one function over many work items, in order, on this machine or on a Ray cluster.

Programs that fan out (scoring, signatures, ingestion of file pieces, LSH band groups) call
``map_ordered``; the executor is an execution setting (``ExecutionParams.executor``), never a
parameter, so the output is identical whichever runs it. Results come back in input order with a
bounded number of items in flight, so memory stays flat however many items there are.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from stages.params import ExecutionParams

T = TypeVar("T")
R = TypeVar("R")


def map_ordered(
    fn: Callable[[T], R], items: Iterable[T], execution: ExecutionParams, *, num_cpus: float = 1.0,
    num_gpus: float = 0.0,
) -> Iterator[R]:
    """``fn(item)`` for every item, yielded in input order.

    ``executor="local"``: a process pool of ``resolved_workers()`` processes (inline when 1);
    ``executor="ray"``: Ray tasks with the declared ``num_cpus``/``num_gpus`` on the cluster at
    ``ray_address`` (started locally when None). ``fn`` must be a module-level function.
    """
    workers = execution.resolved_workers()
    if execution.executor == "ray":
        yield from _ray_map(fn, items, execution, num_cpus, num_gpus)
    elif workers <= 1:
        yield from map(fn, items)
    else:
        from concurrent.futures import Future, ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            pending: deque[Future[R]] = deque()
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()


def _ray_map(
    fn: Callable[[T], R], items: Iterable[T], execution: ExecutionParams, num_cpus: float, num_gpus: float
) -> Iterator[R]:
    import ray  # only the Ray executor needs it

    if not ray.is_initialized():
        ray.init(address=execution.ray_address, ignore_reinit_error=True, log_to_driver=False)
    remote: Any = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(fn)
    in_flight = max(2, 2 * int(ray.cluster_resources().get("CPU", 1) // max(num_cpus, 1e-9)))
    pending: deque[Any] = deque()
    for item in items:
        pending.append(remote.remote(item))
        if len(pending) >= in_flight:
            yield ray.get(pending.popleft())
    while pending:
        yield ray.get(pending.popleft())


def zip_results(
    items: Iterable[T], fn: Callable[[T], R], execution: ExecutionParams, **resources: float
) -> Iterator[tuple[T, R]]:
    """(item, fn(item)) pairs in input order (items are kept until their result arrives)."""
    held: deque[T] = deque()

    def remember(items: Iterable[T]) -> Iterator[T]:
        for item in items:
            held.append(item)
            yield item

    for result in map_ordered(fn, remember(items), execution, **resources):
        yield held.popleft(), result
