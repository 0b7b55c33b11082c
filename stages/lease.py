"""A partition lease on S3: one writer of a partition at a time, with conditional writes.

A local data root locks a partition with ``flock`` (``stages.store.PartitionWriter``); object
storage has no lock, and two attempts on one partition (automation and ``curate submit`` on the
same crawl, a retry launched while a lost pod still runs) could interleave their commits: one
attempt's clean-up deletes the parts the other's manifest names. The lease is the object
``<root>/.locks/<hash of the partition dir>.lease`` (JSON: owner, host, pid, expiry), created
with ``If-None-Match: *`` and renewed and released with ``If-Match: <its ETag>``, so of two
writers exactly one holds it: S3 (since 2024), MinIO and moto check both preconditions.

- **Busy**: a lease another attempt renews is ``PartitionBusy`` at once (after one renewal
  period of looking: a live holder renews every ``ttl_s / 4``).
- **Abandoned**: a holder killed without releasing stops renewing; its lease is taken over once
  it has expired (``ttl_s`` after its last renewal, by the wall clock; clocks must agree within
  ``ttl_s / 4``), so a retry waits at most ``ttl_s`` instead of failing.
- **Lost**: a holder whose renewal failed (it stalled past its expiry and another attempt took
  over) refuses to commit (``LeaseLost``): the taker's output wins, and no manifest ever names
  parts another attempt may delete.

Stores other than s3fs have no lease, nor does an S3-compatible store that does not check the
preconditions (probed once per bucket: ``checks_preconditions``); the operator keeps one writer
per partition there (docs/operations.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
import uuid
from typing import Any

DEFAULT_TTL_S = 60.0
TTL_ENV = "CURATE_LEASE_TTL_S"


class LeaseBusy(RuntimeError):
    """Another live attempt holds the partition."""


class LeaseLost(RuntimeError):
    """This attempt's lease expired and another attempt took the partition over."""


def supports_leases(fs: Any) -> bool:
    """s3fs: its writes pass ``IfNoneMatch`` / ``IfMatch`` to PutObject."""
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return bool({"s3", "s3a"} & set(protocol))


_CHECKED: dict[str, bool] = {}  # bucket -> whether its store refuses a failed precondition


def checks_preconditions(fs: Any, root: str) -> bool:
    """Whether the store behind ``root`` refuses a PUT whose precondition fails, probed once per
    bucket and process: a store that ignored ``If-None-Match`` would grant every attempt the
    lease, and each would then remove the other's parts as leftovers."""
    bucket = root.split("/", 1)[0]
    if bucket not in _CHECKED:
        probe = f"{root}/.locks/.probe-{uuid.uuid4().hex}"
        fs.pipe_file(probe, b"probe", IfNoneMatch="*")
        try:
            fs.pipe_file(probe, b"again", IfNoneMatch="*")
            _CHECKED[bucket] = False
        except Exception as exc:
            _CHECKED[bucket] = _precondition_failed(exc)
        finally:
            try:
                fs.rm_file(probe)
            except Exception:  # a probe left behind is harmless
                pass
    return _CHECKED[bucket]


def _precondition_failed(exc: BaseException) -> bool:
    """s3fs's mapping of 412 PreconditionFailed (and 409 ConditionalRequestConflict, a
    concurrent conditional write): FileExistsError for If-None-Match, OSError otherwise."""
    text = str(exc)
    return isinstance(exc, FileExistsError) or "pre-condition" in text or "Precondition" in text or (
        "ConditionalRequestConflict" in text)


class Lease:
    """The lease of one partition directory ``pdir`` on ``fs``; ``acquire`` before writing,
    ``check`` before publishing, ``release`` at the end. Renewed by a daemon thread."""

    def __init__(self, fs: Any, root: str, pdir: str, ttl_s: float | None = None,
                 clock: Any = time.time) -> None:
        self.fs = fs
        self.path = f"{root}/.locks/{hashlib.sha256(pdir.encode()).hexdigest()[:32]}.lease"
        self.pdir = pdir
        self.ttl_s = float(ttl_s if ttl_s is not None else os.environ.get(TTL_ENV, DEFAULT_TTL_S))
        self.clock = clock
        self.owner = uuid.uuid4().hex
        self.etag: str | None = None
        self.lost: str | None = None  # why the lease was lost, once it was
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        self._thread: threading.Thread | None = None

    # --- the object ---------------------------------------------------------------------------
    def _body(self) -> bytes:
        return json.dumps({"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
                           "partition": self.pdir, "expires": self.clock() + self.ttl_s}).encode()

    def _put(self, **condition: str) -> str:
        """PUT the lease under ``condition``; its new ETag (from the response: a HEAD after it
        could already see a taker's)."""
        out = self.fs.pipe_file(self.path, self._body(), **condition)
        self.fs.invalidate_cache(self.path.rsplit("/", 1)[0])
        etag = out.get("ETag") if isinstance(out, dict) else None
        return str(etag or self.fs.info(self.path)["ETag"])

    def _take(self, **condition: str) -> bool:
        """PUT the lease under ``condition``: True when it is this attempt's afterwards, False when
        the precondition failed because another attempt holds it; other errors propagate."""
        try:
            self.etag = self._put(**condition)
            return True
        except Exception as exc:
            if not _precondition_failed(exc):
                raise
            return self._mine()

    def _mine(self) -> bool:
        """After a failed precondition: is the lease this attempt's anyway? (a PUT that succeeded on
        the server, then retried by the client after a timeout, fails its own precondition)."""
        held = self._read()
        if held is not None and held[1].get("owner") == self.owner:
            self.etag = held[0]
            return True
        return False

    def _read(self) -> tuple[str, dict[str, Any]] | None:
        """(ETag, content) of the lease object, or None when there is none."""
        self.fs.invalidate_cache(self.path.rsplit("/", 1)[0])
        try:
            etag = str(self.fs.info(self.path)["ETag"])
            return etag, json.loads(self.fs.cat_file(self.path))
        except FileNotFoundError:
            return None

    # --- the protocol -------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lease, or raise ``LeaseBusy`` naming the holder. Waits out an abandoned
        lease (at most ``ttl_s``); returns at once when the partition is free."""
        seen: str | None = None  # the holder's ETag when first seen
        deadline = self.clock() + self.ttl_s * 1.5
        while True:
            if self._take(IfNoneMatch="*"):
                break
            held = self._read()
            if held is None:
                continue  # released in between: try again
            etag, info = held
            if seen is not None and etag != seen:  # renewed (or taken over) meanwhile: alive
                raise LeaseBusy(self._busy(info))
            seen = seen or etag
            if self.clock() > float(info.get("expires", 0)):
                if self._take(IfMatch=etag):  # exactly one taker wins
                    break
                raise LeaseBusy(self._busy(info))
            if self.clock() > deadline:
                raise LeaseBusy(self._busy(info))
            # Look again after one renewal period: a live holder will have renewed by then.
            time.sleep(min(self.ttl_s / 4, max(0.05, float(info.get("expires", 0)) - self.clock())))
        self._thread = threading.Thread(target=self._renew_forever, name="partition-lease", daemon=True)
        self._thread.start()

    def _busy(self, info: dict[str, Any]) -> str:
        return (f"{self.pdir} is being written by another attempt right now (lease held by "
                f"{info.get('host', '?')} pid {info.get('pid', '?')}); rerun once it has finished")

    def renew(self) -> None:
        """Extend the lease; a failed precondition means another attempt took it over."""
        with self._mutex:
            if self.lost is not None or self.etag is None:
                return
            if not self._take(IfMatch=self.etag):
                self.lost = f"{self.pdir}: this attempt's lease expired and another attempt took the partition over"

    def _renew_forever(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                self.renew()
            except Exception:  # a transient store error: the next period tries again
                continue

    def check(self) -> None:
        """Before publishing: renew now, so the lease holds for ``ttl_s`` more; ``LeaseLost``
        if it is gone."""
        try:
            self.renew()
        except Exception as exc:  # unreachable store: publishing would not be safe either
            raise LeaseLost(f"{self.pdir}: the lease could not be renewed ({exc})") from exc
        if self.lost is not None:
            raise LeaseLost(self.lost)

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still this attempt's."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.ttl_s)
        with self._mutex:
            if self.etag is None or self.lost is not None:
                return
            self.etag = None
            try:
                held = self._read()
                if held is not None and held[1].get("owner") == self.owner:
                    self.fs.rm_file(self.path)
            except Exception:  # it expires by itself
                return
