"""The ``curation`` resource: where the workdir is and how a stage task is executed.

Environments differ only here (local folder or ``s3://``, in-process or a ``python -m stages``
subprocess speaking Dagster Pipes), never in asset code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

from dagster import (
    AssetExecutionContext,
    ConfigurableResource,
    DataVersion,
    Failure,
    MaterializeResult,
    PipesSubprocessClient,
)

from stages.params import ExecutionParams
from stages.paths import Store
from stages.registry import CrawlSpec, execute, metadata, prior_outputs


def spec_path(workdir: str | Path, crawl: str) -> Path:
    return Path(workdir) / "crawls" / f"{crawl}.json"


def load_spec(workdir: str | Path, crawl: str) -> CrawlSpec:
    path = spec_path(workdir, crawl)
    if not path.exists():
        raise Failure(f"crawl {crawl!r} has no spec at {path}; register it with `curate run`")
    return CrawlSpec.model_validate_json(path.read_text())


def save_spec(workdir: str | Path, spec: CrawlSpec) -> Path:
    path = spec_path(workdir, spec.crawl)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(json.loads(spec.model_dump_json()), indent=1, sort_keys=True))
    tmp.replace(path)
    return path


def earlier_crawls(workdir: str | Path, crawl: str) -> list[str]:
    """Crawls registered in ``workdir`` before ``crawl`` was (by spec file time), oldest first."""
    specs = sorted((Path(workdir) / "crawls").glob("*.json"), key=lambda p: (p.stat().st_mtime, p.stem))
    return [p.stem for p in specs if p.stem != crawl]


def prior_specs(workdir: str | Path, crawls: list[str]) -> dict[str, dict[str, str]]:
    """``CrawlSpec.dedup_against`` for the named earlier crawls: the keys of their outputs."""
    return {c: prior_outputs(load_spec(workdir, c)) for c in crawls}


class CurationResource(ConfigurableResource):  # type: ignore[type-arg]
    """Workdir (crawl specs), data root (outputs) and execution settings of stage tasks."""

    workdir: str
    data_root: str | None = None  # default <workdir>/data; any fsspec URL (s3://bucket/prefix)
    mode: Literal["in_process", "pipes", "k8s"] = "in_process"  # k8s: one pod per partition
    batch_rows: int = 20_000
    workers: int = 0  # 0 = every core

    def root(self) -> str:
        return self.data_root or str(Path(self.workdir) / "data")

    def store(self) -> Store:
        return Store(self.root())

    def spec(self, crawl: str) -> CrawlSpec:
        return load_spec(self.workdir, crawl)

    def execution(self) -> ExecutionParams:
        return ExecutionParams(batch_rows=self.batch_rows, workers=self.workers)

    def command(self, program: str, crawl: str, source: str | None) -> list[str]:
        """The stage command line: what a subprocess or a Kubernetes pod runs for one partition."""
        cmd = ["-m", "stages", program, "--workdir", self.workdir, "--crawl", crawl,
               "--data-root", self.root(), "--batch-rows", str(self.batch_rows), "--workers", str(self.workers)]
        return cmd + (["--source", source] if source is not None else [])

    def materialize(
        self, context: AssetExecutionContext, program: str, crawl: str, source: str | None
    ) -> MaterializeResult:
        """Run one partition (skipped when its committed output is up to date) and describe it."""
        spec = self.spec(crawl)
        if source is not None and source not in spec.sources:
            # The source dimension is shared by every crawl, so source x crawl holds pairs that
            # are no partition of the crawl. Recording them as empty keeps backfills of any
            # source x crawl range and the eager automation of fan-in assets from waiting on them.
            context.log.info(f"{program}[{crawl}|{source}]: source {source!r} is not part of crawl {crawl!r}")
            return MaterializeResult(metadata={"in_crawl": False, "crawl_sources": sorted(spec.sources)})
        if self.mode == "pipes":
            client = PipesSubprocessClient()
            result = client.run(context=context, command=[sys.executable, *self.command(program, crawl, source)])
            return result.get_materialize_result()
        if self.mode == "k8s":
            from curation_dagster.k8s import materialize_in_pod  # imports kubernetes only here

            return materialize_in_pod(context, self, program, crawl, source)
        try:
            outcome = execute(self.store(), spec, program, source, self.execution())
        except (FileNotFoundError, KeyError, ValueError) as exc:
            raise Failure(f"{program}[{source or crawl}]: {exc}") from exc
        context.log.info(
            f"{program}[{source or crawl}] {'up to date' if outcome.skipped else 'materialized'} "
            f"at {outcome.manifest.params_key} in {outcome.seconds:.2f}s"
        )
        return MaterializeResult(
            metadata=metadata(outcome), data_version=DataVersion(outcome.manifest.data_version)
        )
