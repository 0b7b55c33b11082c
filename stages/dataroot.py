"""The data root: outputs, crawl specs and the crawl registry, the only state processes share.

Layout under the data root (a local folder or any fsspec URL, e.g. ``s3://bucket/prefix``)::

    _crawls/<crawl>.json                          the crawl registry: one record per crawl
    <program>/<params_key>/<crawl>[/<source>]/    outputs (stages.store): parts, _manifest.json last
    .locks/                                       partition locks (local data roots only)

No program name starts with ``_`` (tests/stages/test_dataroot.py checks it), so ``_crawls`` is never a
program's output folder. A record (:class:`CrawlRecord`) holds the crawl's spec and its
registration ``sequence``: the registration order is read from the records, never from file
times, which object stores do not keep in a useful way. A record is written whole (local:
temporary file, fsync, rename; object storage: one PUT), so a reader sees the old one or the new.

``curate``, the Dagster code location, run workers and stage pods resolve the data root the same
way (:meth:`DataRoot.open`) and find every spec there, so a deployment needs no shared volume.
A crawl is *published* once its removal ledger is committed for its current spec; a new crawl is
deduplicated against the kept documents of the crawls published before it (``dedup_against``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from stages.catalog import PROGRAMS
from stages.credentials import check_url, storage_options
from stages.errors import DamagedFile
from stages.spec import CrawlSpec, prior_outputs, priors_current
from stages.store import Manifest, Store, check_name, retry, use_storage_options

CRAWLS_DIR = "_crawls"
DATA_ROOT_ENV = "CURATE_DATA_ROOT"
DATA_ROOT_FILE = "data_root"  # <workdir>/data_root: where `curate run --data-root` put the outputs
LEGACY_SPECS = "crawls"  # <workdir>/crawls/<crawl>.json: where specs lived before the registry


class NoDataRoot(ValueError):
    """Neither a data root nor a workdir was given."""


class UnknownCrawl(LookupError):
    """The crawl has no record in the data root."""


class StalePrior(ValueError):
    """A crawl is deduplicated against outputs of an earlier crawl that cannot be refreshed."""


def data_root_url(data_root: str | None = None, workdir: str | os.PathLike[str] | None = None) -> str:
    """The data root in use: ``data_root``, else ``$CURATE_DATA_ROOT``, else the one the workdir's
    last ``curate run --data-root`` recorded (``<workdir>/data_root``), else ``<workdir>/data``.
    A data root carrying a credential is refused (:func:`stages.credentials.check_url`)."""
    if data_root:
        return check_url("data root", data_root)
    if os.environ.get(DATA_ROOT_ENV):
        return check_url(f"data root (${DATA_ROOT_ENV})", os.environ[DATA_ROOT_ENV])
    if workdir is None:
        raise NoDataRoot(f"no data root: give --data-root URL (or set ${DATA_ROOT_ENV}) or --workdir DIR")
    recorded = Path(workdir) / DATA_ROOT_FILE
    if recorded.exists() and recorded.read_text().strip():
        return check_url(f"data root ({recorded})", recorded.read_text().strip())
    return str(Path(workdir) / "data")


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


class CrawlRecord(BaseModel):
    """``_crawls/<crawl>.json``: a registered crawl. ``sequence`` and ``registered_at`` are set
    when the crawl is first registered and kept when its spec changes; the registration order
    is (sequence, registered_at, crawl): two crawls registered at the same moment by different
    processes may draw the same sequence, and the time (then the name) orders them."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    crawl: str
    sequence: int
    registered_at: str  # ISO 8601, UTC
    updated_at: str
    spec: CrawlSpec

    def model_post_init(self, __context: Any) -> None:
        if self.spec.crawl != self.crawl:
            raise ValueError(f"record of crawl {self.crawl!r} holds the spec of crawl {self.spec.crawl!r}")

    @property
    def order(self) -> tuple[int, str, str]:
        return self.sequence, self.registered_at, self.crawl


class DataRoot:
    """The data root in use: its :class:`Store` (outputs) and the crawl registry on it.

    ``legacy_specs``: a workdir's ``crawls/`` folder from before the registry; its specs are
    registered here (in their old order, by file time) the first time they are looked for.
    """

    def __init__(self, store: Store, legacy_specs: Path | None = None) -> None:
        self.store = store
        self.legacy_specs = legacy_specs

    @classmethod
    def open(
        cls, data_root: str | None = None, workdir: str | os.PathLike[str] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> DataRoot:
        """The one place the data root is resolved (:func:`data_root_url`, :func:`storage_options`).
        The options also become this process's fsspec defaults for the root's protocol, so
        source URLs in the same store (fingerprinted before any stage runs) open alike."""
        url = data_root_url(data_root, workdir)
        opts = storage_options(options)
        use_storage_options(url, opts)
        return cls(Store(url, opts), Path(workdir) / LEGACY_SPECS if workdir is not None else None)

    @property
    def url(self) -> str:
        """The data root as a URL, for messages."""
        return self.store.root if self.store.is_local else str(self.store.fs.unstrip_protocol(self.store.root))

    def record_path(self, crawl: str) -> str:
        """``<root>/_crawls/<crawl>.json``; an unsafe crawl name (``../x``) is an UnsafeNameError."""
        return f"{self.store.root}/{CRAWLS_DIR}/{check_name('crawl', crawl)}.json"

    # --- reading ---------------------------------------------------------------------------

    def record(self, crawl: str) -> CrawlRecord | None:
        """The crawl's record, or None when it is not registered."""
        path = self.record_path(crawl)
        blob = self.store.read_text(path)
        if blob is None and self.legacy_specs is not None and (self.legacy_specs / f"{crawl}.json").exists():
            self._migrate()
            blob = self.store.read_text(path)
        return None if blob is None else _parse_record(path, blob)

    def spec(self, crawl: str) -> CrawlSpec:
        record = self.record(crawl)
        if record is None:
            raise UnknownCrawl(f"crawl {crawl!r} is not registered in {self.url}; register it with `curate run`")
        return record.spec

    def records(self) -> list[CrawlRecord]:
        """Every registered crawl, in registration order."""
        self._migrate()
        out = [_parse_record(path, blob) for path, blob in self._blobs()]
        return sorted(out, key=lambda r: r.order)

    def _names(self) -> list[str]:
        folder = f"{self.store.root}/{CRAWLS_DIR}"
        self.store.fs.invalidate_cache(folder)
        try:
            paths = retry(lambda: self.store.fs.ls(folder, detail=False))
        except FileNotFoundError:
            return []
        names = (str(p).rstrip("/").rsplit("/", 1)[-1] for p in paths)
        return sorted(n.removesuffix(".json") for n in names if n.endswith(".json") and not n.startswith("."))

    def _blobs(self) -> list[tuple[str, str]]:
        """(path, text) of every crawl record."""
        folder = f"{self.store.root}/{CRAWLS_DIR}"
        paths = [f"{folder}/{name}.json" for name in self._names()]
        blobs = ((p, self.store.read_text(p)) for p in paths)
        return [(p, b) for p, b in blobs if b is not None]

    def output_dir(self, spec: CrawlSpec, program: str, source: str | None) -> str:
        """The folder of one partition's output for ``spec``'s current parameters (committed or
        not); ``source`` is ignored for a crawl-level program. An unknown program or a source
        outside the crawl is a KeyError."""
        if program not in PROGRAMS:
            raise KeyError(f"unknown program {program!r}; known: {', '.join(PROGRAMS)}")
        src = source if PROGRAMS[program].level == "source" else None
        spec.check_partition(program, src)
        return self.store.partition_dir(program, spec.key_map()[(program, src)], spec.crawl, src)

    def manifest(self, spec: CrawlSpec, program: str, source: str | None) -> Manifest | None:
        """The committed manifest of one partition for ``spec``'s current parameters, or None
        when that partition has no committed output: the one way to read a current manifest."""
        return self.store.read_manifest(self.output_dir(spec, program, source))

    def published(self, spec: CrawlSpec) -> bool:
        """The crawl's removal ledger is committed for ``spec``."""
        return self.manifest(spec, "removal_ledger", None) is not None

    # --- writing ---------------------------------------------------------------------------

    def register(self, spec: CrawlSpec) -> CrawlRecord:
        """Save ``spec``: a new crawl is appended to the registration order; a registered one
        keeps its place. An unchanged spec is not rewritten."""
        existing = self.record(spec.crawl)
        if existing is not None and existing.spec == spec:
            return existing
        now = _now()
        if existing is not None:
            record = existing.model_copy(update={"spec": spec, "updated_at": now})
        else:
            sequence = max((r.sequence for r in self.records()), default=0) + 1
            record = CrawlRecord(crawl=spec.crawl, sequence=sequence, registered_at=now, updated_at=now, spec=spec)
        self._write(record)
        return record

    def _write(self, record: CrawlRecord) -> None:
        blob = json.dumps(json.loads(record.model_dump_json()), indent=1, sort_keys=True)
        self.store.write_atomic(self.record_path(record.crawl), blob)

    def _migrate(self) -> None:
        """Register the specs of ``<workdir>/crawls/`` that the data root does not hold yet, in
        their old order (file time, then name: what ordered them before). The old files stay."""
        if self.legacy_specs is None or not self.legacy_specs.is_dir():
            return
        known = set(self._names())
        old = sorted((p for p in self.legacy_specs.glob("*.json") if p.stem not in known),
                     key=lambda p: (p.stat().st_mtime, p.stem))
        if not old:
            return
        sequence = max((_parse_record(p, b).sequence for p, b in self._blobs()), default=0)
        for path in old:
            spec = CrawlSpec.model_validate_json(path.read_text())
            sequence += 1
            when = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).isoformat(timespec="microseconds")
            self._write(CrawlRecord(crawl=spec.crawl, sequence=sequence, registered_at=when, updated_at=_now(),
                                    spec=spec))

    # --- cross-crawl dedup -------------------------------------------------------------------

    def earlier_crawls(self, crawl: str) -> list[str]:
        """Published crawls registered before ``crawl`` (every published crawl when ``crawl`` is
        new), oldest first: a new crawl is deduplicated against their kept documents."""
        out = []
        for record in self.records():
            if record.crawl == crawl:
                break
            if self.published(record.spec):
                out.append(record.crawl)
        return out

    def prior_specs(self, crawls: Sequence[str]) -> dict[str, dict[str, str]]:
        """``CrawlSpec.dedup_against`` for the named earlier crawls: the keys of their current outputs."""
        return {c: prior_outputs(self.spec(c)) for c in crawls}

    def build_spec(
        self, crawl: str, sources: Mapping[str, Mapping[str, Any]], *, stages: Sequence[str] | None = None,
        params: Mapping[str, Mapping[str, Any]] | None = None, keep: Mapping[str, Any] | None = None,
        against: Sequence[str] | None = None, allow_damaged_files: bool | None = None,
    ) -> CrawlSpec:
        """The spec of ``crawl`` (the one function that makes one: ``curate run``, the recrawl
        sensor and schedule). ``sources``: per source, the fields of ``RawDocumentsParams``;
        ``stages``, ``params``, ``keep``: None for the defaults (every stage, no overrides).
        ``dedup_against``: the current outputs of the ``against`` crawls (``[]``: none); else,
        for a registered crawl, the entries it has (see :meth:`refresh_priors`); else those of
        every crawl published before it. Nothing is saved (:meth:`register` does)."""
        if against is not None:
            if crawl in against:
                raise ValueError(f"crawl {crawl!r} cannot be deduplicated against itself")
            dedup = self.prior_specs(against)
        else:
            saved = self.record(crawl)
            dedup = saved.spec.dedup_against if saved is not None else self.prior_specs(self.earlier_crawls(crawl))
        fields: dict[str, Any] = {"crawl": crawl, "sources": {k: dict(v) for k, v in sources.items()},
                                  "dedup_against": dedup}
        if stages is not None:
            fields["stages"] = tuple(stages)
        if params is not None:
            fields["params"] = {k: dict(v) for k, v in params.items()}
        if keep is not None:
            fields["keep"] = dict(keep)
        if allow_damaged_files is not None:
            fields["allow_damaged_files"] = bool(allow_damaged_files)
        return CrawlSpec.model_validate(fields)

    def stale_priors(self, spec: CrawlSpec) -> dict[str, str]:
        """The earlier crawls ``spec`` was deduplicated against whose outputs are no longer their
        current ones, with why: {crawl: reason}. A document removed as a duplicate of one such
        crawl's document may be lost from both, if that crawl's new run removed its copy."""
        out = {}
        for crawl, outputs in sorted(spec.dedup_against.items()):
            record = self.record(crawl)
            if record is None:
                out[crawl] = f"crawl {crawl} is not registered in {self.url}"
            elif not priors_current(record.spec, outputs):
                out[crawl] = f"crawl {crawl}'s spec changed since (rerun with new parameters)"
        return out

    def refresh_priors(self, spec: CrawlSpec) -> tuple[CrawlSpec, list[str]]:
        """``spec`` deduplicated against the current outputs of every earlier crawl it names
        (which re-keys its cross-crawl dedup), and the crawls whose entries changed. A stale
        crawl must be published for its current spec; else StalePrior, naming both crawls."""
        stale = self.stale_priors(spec)
        if not stale:
            return spec, []
        dedup = dict(spec.dedup_against)
        for crawl, why in stale.items():
            record = self.record(crawl)
            if record is None:
                raise StalePrior(f"crawl {spec.crawl} is deduplicated against crawl {crawl}, which is not "
                                 f"registered in {self.url}: choose its earlier crawls with --against")
            if not self.published(record.spec):
                raise StalePrior(f"crawl {spec.crawl} is deduplicated against crawl {crawl}: {why} and its new "
                                 f"outputs are not committed; finish `curate run --crawl {crawl}` first "
                                 "(or choose the earlier crawls with --against)")
            dedup[crawl] = prior_outputs(record.spec)
        refreshed = CrawlSpec.model_validate({**spec.model_dump(), "dedup_against": dedup})
        return refreshed, sorted(stale)

    def stale_dependents(self, crawl: str) -> list[str]:
        """Registered crawls deduplicated against outputs of ``crawl`` that are no longer its
        current ones (it was rerun with new parameters since), in registration order."""
        record = self.record(crawl)
        if record is None:
            return []
        return [r.crawl for r in self.records()
                if r.crawl != crawl and crawl in r.spec.dedup_against
                and not priors_current(record.spec, r.spec.dedup_against[crawl])]


def _parse_record(path: str, blob: str) -> CrawlRecord:
    """The crawl record in ``blob``; a damaged one (truncated, not a record) is a ``DamagedFile``
    naming ``path``."""
    from pydantic import ValidationError

    try:
        return CrawlRecord.model_validate_json(blob)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {"msg": str(exc), "loc": ()}
        where = ".".join(str(p) for p in first.get("loc", ())) or "record"
        raise DamagedFile(path, "crawl record", f"{where}: {first['msg']} ({exc.error_count()} error(s))") from None
