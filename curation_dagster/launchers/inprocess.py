"""Run a stage partition in this process: ``stages.execute.execute`` on the data root's store."""

from __future__ import annotations

from dagster import AssetExecutionContext, DataVersion, Failure, MaterializeResult

from stages.errors import StageError
from stages.execute import execute, metadata
from stages.params import ExecutionParams
from stages.spec import CrawlSpec
from stages.store import Store


def launch(
    context: AssetExecutionContext, store: Store, spec: CrawlSpec, program: str, source: str | None,
    execution: ExecutionParams,
) -> MaterializeResult:
    """Run one partition (skipped when its committed output is up to date) and describe it."""
    try:
        outcome = execute(store, spec, program, source, execution, emit=context.log.info)
    except (FileNotFoundError, KeyError, ValueError, StageError) as exc:  # one line, not a trace
        raise Failure(f"{program}[{source or spec.crawl}]: {exc}") from exc
    context.log.info(
        f"{program}[{source or spec.crawl}] {'up to date' if outcome.skipped else 'materialized'} "
        f"at {outcome.manifest.params_key} in {outcome.seconds:.2f}s"
    )
    return MaterializeResult(metadata=metadata(outcome), data_version=DataVersion(outcome.manifest.data_version))
