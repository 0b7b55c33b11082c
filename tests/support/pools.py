"""The warm pool's tests' crawls: the tiny corpus's first source as many sources, registered in a
fresh workdir (``curation_dagster.run.pool``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from curation_dagster.defs.resources import CurationResource
from stages.spec import CrawlSpec
from tests.support.tiny_corpus import CRAWL, EXPECTED, fast_tmp, source_config


def many_sources(n: int) -> CrawlSpec:
    """The tiny corpus's first source, as ``n`` sources: its steps with partitions are raw,
    language and heuristic documents, then (exact dedup switched off) the MinHash signatures."""
    first = next(iter(source_config().values()))
    return CrawlSpec(crawl=CRAWL, sources={f"c{i:02d}": first for i in range(n)}, keep=EXPECTED["keep"],
                     stages=("language", "heuristic", "fuzzy"))


@contextmanager
def registered(fallback: Path, crawl: CrawlSpec, workers: int = 2) -> Iterator[CurationResource]:
    """The ``curation`` resource of a fresh workdir (``fast_tmp``: on a tmpfs where one has room,
    else ``fallback``) with ``workers`` pool workers, ``crawl`` registered in it."""
    with fast_tmp(fallback) as work:
        resource = CurationResource(workdir=str(work), workers=workers)
        resource.dataroot().register(crawl)
        yield resource
