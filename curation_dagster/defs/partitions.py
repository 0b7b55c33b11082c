"""Partitions: ``source`` x ``crawl`` for per-document assets, ``crawl`` for corpus-wide ones.

Both dimensions are dynamic: ``curate run`` (or a recrawl sensor) adds a crawl and its sources.
"""

from __future__ import annotations

import warnings

from dagster import (
    BetaWarning,
    DynamicPartitionsDefinition,
    Failure,
    MultiPartitionKey,
    MultiPartitionsDefinition,
    MultiToSingleDimensionPartitionMapping,
    PartitionsDefinition,
)

from stages.catalog import partition_name
from stages.spec import CrawlSpec

CRAWL = "crawl"
SOURCE = "source"

crawl_partitions = DynamicPartitionsDefinition(name=CRAWL)
source_partitions = DynamicPartitionsDefinition(name=SOURCE)
source_crawl_partitions = MultiPartitionsDefinition({CRAWL: crawl_partitions, SOURCE: source_partitions})

# source x crawl <-> crawl: a crawl-level asset reads every source of its crawl, and a
# per-source asset reads the crawl-level partition of its own crawl.
# (beta in dagster 1.13, pinned: quiet in every process that imports this, pool workers included)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", BetaWarning)
    by_crawl = MultiToSingleDimensionPartitionMapping(partition_dimension_name=CRAWL)


def partitions_for(level: str) -> PartitionsDefinition:
    return source_crawl_partitions if level == "source" else crawl_partitions


def partition_key(crawl: str, source: str | None) -> str:
    """The Dagster partition key of a (crawl, source) partition (source None: crawl level)."""
    return crawl if source is None else MultiPartitionKey({CRAWL: crawl, SOURCE: source})


def split_key(key: str | MultiPartitionKey, level: str) -> tuple[str, str | None]:
    """(crawl, source) of a partition key."""
    if level == "source":
        dims = key.keys_by_dimension if isinstance(key, MultiPartitionKey) else dict(
            kv for kv in zip((CRAWL, SOURCE), str(key).split("|"), strict=True)
        )
        return dims[CRAWL], dims[SOURCE]
    return str(key), None


def refuse_outside(crawl: str, source: str | None, spec: CrawlSpec, program: str) -> None:
    """Fail, naming the crawl's sources, when ``source`` is no source of the crawl: the pair is
    in source x crawl (the source dimension is shared by every crawl) but is no partition; or,
    naming the crawl's stages, when the crawl switched ``program``'s stage off (it has no
    partition in that crawl: nothing reads it)."""
    if spec.switched_off(program):
        raise Failure(
            description=f"{partition_name(program, crawl, source)}: {spec.switched_off_why(program)}, so "
                        f"{program} has no partition in it; nothing materialized (select the assets of "
                        "the crawl's stages, or launch the crawl job curate_run)",
            metadata={"crawl_stages": list(spec.stages)}, allow_retries=False)
    if source is not None and source not in spec.sources:
        raise Failure(
            description=f"{partition_name(program, crawl, source)}: source {source!r} is not part of crawl "
                        f"{crawl!r}, whose sources are {', '.join(sorted(spec.sources))}; nothing materialized "
                        "(the UI offers every source x crawl pair: the source dimension is shared by every crawl)",
            metadata={"crawl_sources": sorted(spec.sources)}, allow_retries=False)
