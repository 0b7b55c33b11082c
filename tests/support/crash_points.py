"""Crash points for the crash-and-resume tests: every place a stage process can die while writing.

``install(kill_at, log)`` wraps ``pyarrow.parquet.write_table`` and ``os.replace`` (what
``stages.store.PartitionWriter`` writes parts and publishes manifests with) in THIS process, so
no test hook lives in the product code. Four kinds of point, numbered in the order they happen:

- ``part``     a part file has been opened (empty) and nothing written to it yet
- ``mid``      half of a part's bytes are on disk (flushed): a partial Parquet file
- ``manifest`` every part is written and the new manifest is a temporary file, not published
- ``cleanup``  the manifest is published; parts of superseded attempts are not yet deleted

At point number ``kill_at`` the process SIGKILLs itself (what a preempted node or the OOM killer
does); ``log`` receives ``(kind, path)`` per point. Worker processes (forked by a process pool)
never count or die: only the process that writes.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from typing import Any

import pyarrow.parquet as pq

from stages.store import MANIFEST


def install(kill_at: int | None, log: list[tuple[str, str]]) -> None:
    main = os.getpid()
    real_write_table, real_replace = pq.write_table, os.replace

    def point(kind: str, path: str) -> None:
        log.append((kind, path))
        if kill_at is not None and len(log) == kill_at:
            print(f"KILLED {kind} {path}", file=sys.stderr, flush=True)
            os.kill(main, signal.SIGKILL)

    def write_table(table: Any, where: Any, *args: Any, **kwargs: Any) -> None:
        if os.getpid() != main or isinstance(where, str | os.PathLike):
            return real_write_table(table, where, *args, **kwargs)
        name = str(getattr(where, "path", getattr(where, "name", "?")))
        point("part", name)
        buf = io.BytesIO()
        real_write_table(table, buf, *args, **kwargs)
        data = buf.getvalue()
        where.write(data[: len(data) // 2])
        where.flush()
        point("mid", name)
        where.write(data[len(data) // 2:])

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if os.getpid() != main or not str(dst).endswith(MANIFEST):
            return real_replace(src, dst, *args, **kwargs)
        point("manifest", str(dst))
        real_replace(src, dst, *args, **kwargs)
        point("cleanup", str(dst))

    pq.write_table = write_table
    os.replace = replace  # type: ignore[assignment]


if __name__ == "__main__":
    # python tests/support/crash_points.py KILL_AT DATA_ROOT: the tiny corpus crawl (heuristic, exact,
    # fuzzy), killed at point KILL_AT (0: never; it then prints the number of points).
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests.support
    from stages.execute import execute_crawl
    from stages.params import ExecutionParams
    from stages.store import Store
    from tests.support.tiny_corpus import spec

    kill_at = int(sys.argv[1]) or None
    points: list[tuple[str, str]] = []
    install(kill_at, points)
    execute_crawl(Store(sys.argv[2]), spec(stages=("heuristic", "exact", "fuzzy")),
                  ExecutionParams(batch_rows=7, ingest_task_bytes=4096, workers=2))
    print(len(points))
