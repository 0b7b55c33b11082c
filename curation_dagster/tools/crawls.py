"""The crawl spec of a new or rerun crawl, from what ``curate run/register/submit`` or a recrawl
(sensor, schedule) gives: one builder over ``stages.dataroot.DataRoot.build_spec``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stages.dataroot import DataRoot
from stages.spec import CrawlSpec


def crawl_spec(
    root: DataRoot, crawl: str, sources: Mapping[str, Mapping[str, Any]], *, base: CrawlSpec | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None, stages: Sequence[str] | None = None,
    keep: Mapping[str, Any] | None = None, against: Sequence[str] | None = None,
    allow_damaged_files: bool | None = None,
) -> CrawlSpec:
    """The spec of ``crawl`` in ``root`` (not saved). ``sources``: per source, the fields of
    ``RawDocumentsParams`` (``url`` included). ``params``, ``stages``, ``keep``: as given, else
    ``base``'s (a template crawl, or the crawl's registered spec), else the defaults.
    ``against`` (the crawls to dedup against) and ``allow_damaged_files``: as given, else
    ``DataRoot.build_spec``'s defaults; they belong to the crawl, never to its base."""
    if base is not None:
        params = base.params if params is None else params
        stages = base.stages if stages is None else stages
        keep = base.keep.model_dump() if keep is None else keep
    return root.build_spec(crawl, sources, params=params, stages=stages, keep=keep, against=against,
                           allow_damaged_files=allow_damaged_files)
