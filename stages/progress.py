"""Progress of one partition, as lines a person reads while a long stage runs.

A program tells its :class:`Progress` how much work it expects (``expect``) and how much it has
done (``advance``: documents and bytes); every ``interval_s`` at most one line goes to ``emit``:

    document_embeddings[c1|web]: 40,000 of 125,000 documents (32%), 96.1 MB, 812 docs/s, ~1m45s left

``execute`` gives each partition one and ends it with a summary line. Where the lines go is the
caller's choice: Dagster Pipes' log (stage subprocesses and Kubernetes pods: the run's log in the
UI), the Dagster step's log (in-process), stderr (``python -m stages`` alone). Without an
``emit`` nothing is measured beyond two integers, so tests and benchmarks pay nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """Documents and bytes done of those expected, reported at most every ``interval_s``."""

    def __init__(self, label: str = "", emit: Callable[[str], None] | None = None, interval_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.emit = emit
        self.interval_s = interval_s
        self.clock = clock
        self.expected = 0  # documents; 0 = unknown
        self.expected_bytes = 0
        self.docs = 0
        self.bytes = 0
        self.started = clock()
        self._last = self.started

    def expect(self, docs: int = 0, nbytes: int = 0) -> None:
        """Add to the work expected (a crawl-level program expects each source in turn)."""
        self.expected += docs
        self.expected_bytes += nbytes

    def advance(self, docs: int = 0, nbytes: int = 0) -> None:
        self.docs += docs
        self.bytes += nbytes
        if self.emit is None:
            return
        now = self.clock()
        if now - self._last >= self.interval_s:
            self._last = now
            self.emit(self.line(now))

    def line(self, now: float | None = None) -> str:
        """Where the partition stands, on one line."""
        elapsed = max((now if now is not None else self.clock()) - self.started, 1e-9)
        parts = [f"{self.docs:,} of {self.expected:,} documents" if self.expected else f"{self.docs:,} documents"]
        # The share done: by documents where they are known, else by bytes (ingestion).
        done, total = (self.docs, self.expected) if self.expected else (self.bytes, self.expected_bytes)
        if total:
            parts[0] += f" ({min(100.0, 100.0 * done / total):.0f}%)"
        if self.bytes:
            parts.append(f"{self.bytes / 1e6:,.1f}" + (f" of {self.expected_bytes / 1e6:,.1f}" if
                                                       self.expected_bytes else "") + " MB")
        parts.append(f"{self.docs / elapsed:,.0f} docs/s")
        if total and 0 < done < total:
            parts.append(f"~{_duration(elapsed * (total - done) / done)} left")
        return f"{self.label}: " + ", ".join(parts)

    def finish(self, skipped: bool = False) -> None:
        """The closing line: what was done, in how long."""
        if self.emit is None:
            return
        elapsed = self.clock() - self.started
        if skipped:
            self.emit(f"{self.label}: up to date, nothing to do")
        else:
            mb = f", {self.bytes / 1e6:,.1f} MB" if self.bytes else ""
            self.emit(f"{self.label}: done, {self.docs:,} documents{mb} in {_duration(elapsed)}"
                      f" ({self.docs / max(elapsed, 1e-9):,.0f} docs/s)")
