"""A crawl's partitions judged by their checks (``stages.checks.CHECK_KINDS``) with the
workdir's bounds as they are now: for the asset checks (``curation_dagster.defs.checks``), the
planner, and each partition described where it ran (``curation_dagster.run.partition``), a warm
pool's worker included, which imports no Dagster."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from curation_dagster.ops.config import load_config
from curation_dagster.run.place import Curation
from stages.checks import CheckKind, NotMaterialized, Verdict
from stages.spec import CrawlSpec
from stages.store import Store


def _would_remove(store: Store, spec: CrawlSpec, program: str, sources: list[str]) -> dict[str, Any]:
    """The stopped stage's removal list as metadata; none where it cannot be read (the check's
    verdict stands without it)."""
    from curation_dagster.run.metadata import pending_metadata

    try:
        return pending_metadata(store, spec, program, sources)
    except (OSError, KeyError, ValueError):
        return {}


Judge = Callable[[CheckKind, str, str | None], Verdict]


def evaluator(curation: Curation, crawl: str) -> Judge:
    """``(kind, program, source) -> Verdict`` for partitions of ``crawl`` with the workdir's bounds
    and the crawl's spec as they are now, read once for every check it judges."""
    root = curation.dataroot()
    record = root.record(crawl)
    checks = load_config(curation.workdir).checks

    def judge(kind: CheckKind, program: str, source: str | None) -> Verdict:
        if record is None:
            return Verdict(False, f"crawl {crawl!r} is not registered in {root.url}", "WARN")
        spec = record.spec
        if source is not None and source not in spec.sources:
            return Verdict(True, f"source {source!r} is not part of crawl {crawl!r}", metadata={"in_crawl": False})
        try:
            verdict = kind.evaluate(root.store, spec, program, source, checks)
        except NotMaterialized as exc:
            return Verdict(False, str(exc), "WARN", {"materialized": False})
        if kind.name == "over_deletion" and not verdict.passed:
            sources = [source] if source is not None else sorted(spec.sources)
            verdict = replace(verdict, metadata={**verdict.metadata, **_would_remove(root.store, spec, program,
                                                                                        sources)})
        return verdict

    return judge
