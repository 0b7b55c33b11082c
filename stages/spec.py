"""The crawl spec: one crawl's sources, stages and parameters, and the keys of its outputs.

``CrawlSpec.keys()`` derives every partition's ``params_key`` from its parameters and its
upstream keys (``stages.params.params_key``), in the catalog's dependency order; a changed
parameter re-keys that output and everything below it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from stages import params as P
from stages.catalog import PROGRAMS, STAGES
from stages.store import check_name, held_within

# CrawlSpec.keys() of the most recently used specs, by their JSON (a few crawls at a time).
_KEYS: dict[str, dict[tuple[str, str | None], str]] = {}
_KEYS_KEPT = 16
# ``curate run``'s pool derives keys in the threads that start steps ahead, beside the run's own
# (``curation_dagster.run.pool.PartitionPool.then_ahead``)
_KEYS_LOCK = threading.Lock()

# The keys derived within ``keys_held``, by the spec's JSON: equal specs (a pool worker's, and its
# checks' evaluator's, read from the data root) share one derivation.
_HELD: ContextVar[dict[str, Mapping[tuple[str, str | None], str]] | None] = ContextVar("keys_held", default=None)


def keys_held() -> AbstractContextManager[None]:
    """Within: each spec's ``key_map`` is derived once (equal specs' once for all). Checking that
    the cached keys still hold validates every program's params again (0.5 ms a call); a
    crawl-wide partition's checks and metadata look up every source's partitions (600 lookups at
    200 sources). The params a key hashes (a model file's fingerprint) may change between two
    runs of a partition, not within one (its run and its description), nor within a pool's pack
    (``curation_dagster.run.pool.run_pack``: its step was planned with the keys of its start):
    nothing is held beyond the block. A block within another holds the outer one's keys."""
    return held_within(_HELD)


class CrawlSpec(BaseModel):
    """Everything that defines one crawl's outputs: its sources and every stage's parameters."""

    # A rejected value (a source URL with a password in it) is never echoed in the error.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
    crawl: str
    sources: dict[str, P.RawDocumentsParams]
    stages: tuple[str, ...] = Field(default_factory=lambda: tuple(STAGES))
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    keep: P.KeepParams = Field(default_factory=P.KeepParams)
    # Earlier crawls whose kept documents this crawl is deduplicated against, each with the keys
    # of the outputs read from it (``prior_outputs``); fixed when the crawl is first registered.
    dedup_against: dict[str, dict[str, str]] = Field(default_factory=dict)
    # Accept sources with damaged files (their records before the damage): the ``input_complete``
    # check then passes with a warning instead of holding the crawl back. Keys no output.
    allow_damaged_files: bool = False
    _json: str | None = PrivateAttr(default=None)  # model_dump_json(), once: the spec is frozen

    def model_post_init(self, __context: Any) -> None:
        check_name("crawl", self.crawl)
        for name in self.sources:
            check_name("source", name)
        unknown = set(self.stages) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stage(s) {sorted(unknown)}; known: {', '.join(STAGES)}")
        bad = set(self.params) - set(PROGRAMS)
        if bad:
            raise ValueError(f"params for unknown program(s) {sorted(bad)}; known: {', '.join(PROGRAMS)}")

    def switched_off(self, program: str) -> bool:
        """Whether ``program`` belongs to a stage this crawl leaves out (``--stages``): it has no
        partition in the crawl's plan (``partitions``), so its crawl step runs and records
        nothing, and the programs after it read without it (``upstream``), as they would if the
        catalog had no such program. Run on its own (``python -m stages``; the UI refuses it), a
        partition of it writes empty outputs (``program_params``: ``enabled: false``), which
        nothing reads."""
        stage = PROGRAMS[program].stage or PROGRAMS[program].part_of
        return stage is not None and stage not in self.stages

    def switched_off_why(self, program: str) -> str:
        """Why a switched-off ``program`` has no partition here, as errors and logs say it."""
        stage = PROGRAMS[program].stage or PROGRAMS[program].part_of
        return f"crawl {self.crawl!r} switched stage {stage} off (its stages: {', '.join(self.stages)})"

    def program_params(self, program: str, source: str | None = None) -> P.ProgramParams:
        prog = PROGRAMS[program]
        if program == "raw_documents":
            assert source is not None
            return self.sources[source]
        values = dict(self.params.get(program, {}))
        if prog.stage is not None or prog.part_of is not None:
            values["enabled"] = not self.switched_off(program)
        return prog.params(**values)

    def partitions(self, program: str) -> list[str | None]:
        """The partitions of ``program`` the crawl runs: its sources in order, or the crawl's one
        (None); none where the program is switched off (``all_partitions``: those too)."""
        return [] if self.switched_off(program) else self.all_partitions(program)

    def all_partitions(self, program: str) -> list[str | None]:
        """The partitions of ``program`` in this crawl, whether it runs them or not."""
        return list(sorted(self.sources)) if PROGRAMS[program].level == "source" else [None]

    def check_partition(self, program: str, source: str | None) -> None:
        """KeyError where ``source`` is no source of this crawl (ignored for a crawl-level
        program)."""
        if PROGRAMS[program].level == "source" and source not in self.sources:
            raise KeyError(f"source {source!r} is not part of crawl {self.crawl!r}")

    def upstream(self, program: str, source: str | None, every: bool = False) -> list[tuple[str, str | None]]:
        """(program, source) pairs this partition reads: same source, fan-in, or fan-out; none of
        a switched-off program's (nothing makes it), whether ``program`` runs in the crawl or not
        (``curate train-quality`` reads what ``quality_scores`` would). ``every``: all of its
        inputs in the catalog, switched off or not (what its key hashes)."""
        out: list[tuple[str, str | None]] = []
        for dep in PROGRAMS[program].deps:
            if not every and self.switched_off(dep):
                continue
            if PROGRAMS[dep].level == "crawl":
                out.append((dep, None))
            elif source is not None:
                out.append((dep, source))
            else:
                out.extend((dep, s) for s in sorted(self.sources))
        return out

    def keys(self) -> dict[tuple[str, str | None], str]:
        """params_key of every (program, source) partition of this crawl, in dependency order.

        Every resolution of a partition needs them and they cost O(sources) to derive (26 ms at 200
        sources, paid by each step, check and up-to-date test of a crawl: O(sources^2) per crawl),
        so they are derived once per distinct spec and copied out. Distinct: its JSON with what
        else a key hashes, each program's params as validated now (model and benchmark files'
        content fingerprints, ``stages.fingerprint``, cached by file identity), params version and
        code versions (``stages.versions``); none of them depends on the source but ingestion's."""
        return dict(self.key_map())

    def __eq__(self, other: object) -> bool:
        """Equal fields (pydantic's also compares private attributes: the cached JSON)."""
        return isinstance(other, CrawlSpec) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # as pydantic's: dict fields

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> CrawlSpec:
        """pydantic's copy, without the JSON of the spec it was copied from."""
        copy = super().model_copy(update=update, deep=deep)
        copy._json = None
        return copy

    def key_map(self) -> Mapping[tuple[str, str | None], str]:
        """``keys()`` without the copy, read-only (a resolution's few lookups)."""
        held = _HELD.get()
        if held is not None and self._dumped() in held:
            return held[self._dumped()]
        keys = MappingProxyType(self._derived()[1])
        if held is not None:
            held[self._dumped()] = keys
        return keys

    def _dumped(self) -> str:
        """The spec's JSON, once (O(sources): 2 ms at 1,000 sources, paid by every resolution
        otherwise; the spec is frozen, and ``model_copy`` drops it)."""
        if self._json is None:
            self._json = self.model_dump_json()
        return self._json

    def derived_keys(self) -> tuple[str, dict[tuple[str, str | None], str]]:
        """(what the keys hold for, the keys): the spec's JSON with each program's params as
        validated now and the params and code versions (``keys``), and a copy of the keys
        derived for them, or cached; another process adopts them with ``adopt_keys``."""
        ident, keys = self._derived()
        return ident, dict(keys)

    def _derived(self) -> tuple[str, dict[tuple[str, str | None], str]]:
        """``derived_keys`` with the cache's own dict (not to be changed)."""
        from stages.versions import code_versions

        # Each program's params as validated now, as JSON (none but ingestion's depends on the
        # source): every resolution derives this (with stage fuzzy alone, 0.17-0.19 -> 0.09-0.10 ms
        # at 200 sources, against parsing each back into a dict and sorting the sources for each
        # program; with every stage, the model files' fingerprints are most of it: stages.fingerprint).
        validated = "\n".join("" if p.name == "raw_documents" else self.program_params(p.name).model_dump_json()
                              for p in PROGRAMS.values())
        versions = [(p.params.version, code_versions(p.name)) for p in PROGRAMS.values()]
        ident = self._dumped() + validated + repr(versions)
        with _KEYS_LOCK:
            cached = _KEYS.pop(ident, None)
        if cached is None:
            cached = self._derive_keys()
        _remember(ident, cached)
        return ident, cached

    def _derive_keys(self) -> dict[tuple[str, str | None], str]:
        keys: dict[tuple[str, str | None], str] = {}
        for name in PROGRAMS:  # PROGRAMS is in topological order
            for source in self.all_partitions(name):
                # Every input's key, a switched-off one's too: a key does not change with the
                # stages a crawl runs (what a later crawl deduplicates against stays published).
                up = {f"{d}/{s or ''}": keys[(d, s)] for d, s in self.upstream(name, source, every=True)}
                if PROGRAMS[name].uses_keep_rule:
                    up["keep"] = P.params_key("keep", self.keep)
                if PROGRAMS[name].reads_prior and self.dedup_against:
                    up["prior"] = json.dumps(self.dedup_against, sort_keys=True)
                keys[(name, source)] = P.params_key(name, self.program_params(name, source), up)
        return keys


def _remember(ident: str, keys: dict[tuple[str, str | None], str]) -> None:
    with _KEYS_LOCK:
        _KEYS[ident] = keys  # most recent last
        while len(_KEYS) > _KEYS_KEPT:
            del _KEYS[next(iter(_KEYS))]


def adopt_keys(ident: str, keys: dict[tuple[str, str | None], str]) -> None:
    """Keys another process derived (``CrawlSpec.derived_keys``), used here while what they were
    derived for still holds: the same spec, each program's params as validated here (a model
    file that changed since re-keys), the same code. A pool worker adopts its pool's: deriving
    them is O(sources) (47 ms at 200 sources, on each worker's first partition)."""
    _remember(ident, keys)


def priors_current(spec: CrawlSpec, saved: Mapping[str, str]) -> bool:
    """Whether ``saved`` (a later crawl's ``dedup_against`` entry for ``spec``'s crawl) names the
    crawl's current outputs (``prior_outputs``). A bucket index saved for a crawl without fuzzy
    dedup, which had an empty one before such a crawl had none, is no change."""
    if spec.switched_off("lsh_buckets"):
        saved = {name: key for name, key in saved.items() if name != "lsh_buckets/"}
    return dict(saved) == prior_outputs(spec)


def prior_outputs(spec: CrawlSpec) -> dict[str, str]:
    """Keys of the outputs a later crawl reads from ``spec``'s crawl: its raw and curated
    documents per source and, where it ran fuzzy dedup, its bucket index (``lsh_buckets``), as
    {"program/source": key}."""
    keys = spec.keys()
    # No bucket index where the crawl left fuzzy dedup out: nothing of its documents to match.
    out = {} if spec.switched_off("lsh_buckets") else {"lsh_buckets/": keys[("lsh_buckets", None)]}
    for source in sorted(spec.sources):
        out[f"raw_documents/{source}"] = keys[("raw_documents", source)]
        out[f"curated_documents/{source}"] = keys[("curated_documents", source)]
    return out
