"""The crawl spec of a new or rerun crawl, from what ``curate run/register/submit`` or a recrawl
(sensor, schedule) gives: one builder over ``stages.dataroot.DataRoot.build_spec``
(``crawl_spec``), and the command line's options read into it (``spec_from_options``)."""

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


class SpecError(ValueError):
    """Options that make no crawl spec (a malformed ``--source``, a new crawl without sources)."""


def spec_from_options(
    root: DataRoot, crawl: str, sources: Sequence[str], stages: str | None, config: Mapping[str, Any],
    against: str | None = None, fields: Mapping[str, str] | None = None,
) -> CrawlSpec:
    """The crawl spec from command-line options and a config file's mapping (``curate run``,
    ``register``, ``submit``): ``sources`` as ``NAME=URL``, ``stages`` and ``against``
    comma-separated (``against`` ``none`` or empty: no earlier crawl). With neither sources nor
    a config, the registered spec of the crawl is reused as it is (``stages`` and ``against``
    may still change it). ``fields`` (``text_field``, ``id_field``, ``url_field``) apply to the
    ``sources`` given here."""
    saved = root.record(crawl)
    stage_list = (tuple(s.strip() for s in stages.split(",") if s.strip()) or None) if stages else None
    names = None if against is None else \
        [] if against.strip() in ("", "none") else [a.strip() for a in against.split(",") if a.strip()]
    if saved is not None and not sources and not config:
        old = saved.spec
        return crawl_spec(root, crawl, {k: v.model_dump() for k, v in old.sources.items()}, base=old,
                          stages=stage_list, against=names, allow_damaged_files=old.allow_damaged_files)
    cfg_sources: dict[str, dict[str, Any]] = dict(config.get("sources", {}))
    for item in sources:
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise SpecError(f"--source expects NAME=URL, got {item!r}")
        cfg_sources[name] = {**cfg_sources.get(name, {}), "url": url, **(fields or {})}
    if not cfg_sources:
        if saved is None:
            raise SpecError(f"crawl {crawl!r} is new: give its sources with --source NAME=URL")
        cfg_sources = {k: v.model_dump() for k, v in saved.spec.sources.items()}
    missing = [name for name, s in cfg_sources.items() if "url" not in s]
    if missing:
        raise SpecError(f"source(s) {', '.join(missing)} have no url")
    return crawl_spec(root, crawl, cfg_sources, stages=stage_list or config.get("stages"),
                      params=config.get("params"), keep=config.get("keep"), against=names,
                      allow_damaged_files=config.get("allow_damaged_files"))
