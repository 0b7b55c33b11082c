"""The ``curation`` resource: where the workdir is and how a stage task is executed.

Environments differ only here (local folder or ``s3://``, in-process or a ``python -m stages``
subprocess speaking Dagster Pipes, a process pool or a Ray cluster), never in asset code.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Literal

from dagster import (
    AssetExecutionContext,
    ConfigurableResource,
    DataVersion,
    Failure,
    MaterializeResult,
    PipesSubprocessClient,
)
from pydantic import Field

from stages.params import ExecutionParams, workdir_tuning
from stages.paths import Store, check_name, use_storage_options
from stages.registry import CrawlSpec, execute, metadata, prior_outputs


def spec_path(workdir: str | Path, crawl: str) -> Path:
    """``<workdir>/crawls/<crawl>.json``; an unsafe crawl name (``../x``) is an UnsafeNameError."""
    return Path(workdir) / "crawls" / f"{check_name('crawl', crawl)}.json"


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


# The data root's fsspec options as JSON, for the stage processes the resource launches (an
# environment variable, never a command-line argument: those show in logs and process lists).
STORAGE_OPTIONS_ENV = "CURATE_STORAGE_OPTIONS"
DATA_ROOT_FILE = "data_root"  # <workdir>/data_root: where `curate run --data-root` put the outputs


def storage_options_from_env() -> dict[str, Any]:
    blob = os.environ.get(STORAGE_OPTIONS_ENV, "")
    return dict(json.loads(blob)) if blob.strip() else {}


def data_root_of(workdir: str | Path) -> str | None:
    """``$CURATE_DATA_ROOT``, else the data root the workdir's last ``curate run`` recorded."""
    path = Path(workdir) / DATA_ROOT_FILE
    return os.environ.get("CURATE_DATA_ROOT") or (path.read_text().strip() or None if path.exists() else None)


def earlier_crawls(workdir: str | Path, crawl: str, data_root: str | None = None) -> list[str]:
    """Published crawls of ``workdir`` registered before ``crawl``, oldest first: those whose
    removal ledger is committed for their current spec. A new crawl is deduplicated against their
    kept documents (``CrawlSpec.dedup_against``)."""
    from stages.registry import plan_task

    store = Store(data_root or str(Path(workdir) / "data"))
    specs = sorted((Path(workdir) / "crawls").glob("*.json"), key=lambda p: (p.stat().st_mtime, p.stem))
    out = []
    for path in specs:
        if path.stem == crawl:
            continue
        spec = load_spec(workdir, path.stem)
        if store.read_manifest(plan_task(store, spec, "removal_ledger", None).output_dir) is not None:
            out.append(path.stem)
    return out


def prior_specs(workdir: str | Path, crawls: list[str]) -> dict[str, dict[str, str]]:
    """``CrawlSpec.dedup_against`` for the named earlier crawls: the keys of their outputs."""
    return {c: prior_outputs(load_spec(workdir, c)) for c in crawls}


class CurationResource(ConfigurableResource):  # type: ignore[type-arg]
    """Workdir (crawl specs), data root (outputs) and execution settings of stage tasks.

    ``storage_options``: fsspec options of the data root (``endpoint_url``, ``profile``,
    ``client_kwargs``, ...), also this process's defaults for source URLs of the same protocol.
    Credentials are best left to the standard AWS environment, profile or pod identity: values
    given here show in the Dagster UI's resource config (never in logs, metadata or manifests).
    ``executor="ray"`` fans the stages' per-batch work out as Ray tasks on ``ray_address``
    (``ray://head:10001``, ``auto``; None: a Ray instance started on this machine).
    """

    workdir: str
    data_root: str | None = None  # default <workdir>/data; any fsspec URL (s3://bucket/prefix)
    storage_options: dict[str, Any] = Field(default_factory=dict)
    mode: Literal["in_process", "pipes", "k8s"] = "in_process"  # k8s: one pod per partition
    batch_rows: int = 20_000
    workers: int = 0  # 0 = every core
    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    backend: Literal["auto", "cpu", "gpu"] = "auto"  # kernels: auto = the GPU twins where torch sees CUDA

    def root(self) -> str:
        return self.data_root or data_root_of(self.workdir) or str(Path(self.workdir) / "data")

    def options(self) -> dict[str, Any]:
        """``storage_options``, else ``$CURATE_STORAGE_OPTIONS`` (JSON), else none."""
        return dict(self.storage_options) or storage_options_from_env()

    def store(self) -> Store:
        """The data root; its storage options also become this process's fsspec defaults for
        its protocol, so source URLs there (fingerprinted before any stage runs) open alike."""
        use_storage_options(self.root(), self.options())
        return Store(self.root(), self.options())

    def spec(self, crawl: str) -> CrawlSpec:
        return load_spec(self.workdir, crawl)

    def execution(self) -> ExecutionParams:
        execution = ExecutionParams(batch_rows=self.batch_rows, workers=self.workers, executor=self.executor,
                                    ray_address=self.ray_address, backend=self.backend)
        return workdir_tuning(self.workdir).apply(execution)  # curate.yaml's execution: section

    def command(self, program: str, crawl: str, source: str | None) -> list[str]:
        """The stage command line: what a subprocess or a Kubernetes pod runs for one partition."""
        cmd = ["-m", "stages", program, "--workdir", self.workdir, "--crawl", crawl,
               "--data-root", self.root(), "--batch-rows", str(self.batch_rows), "--workers", str(self.workers)]
        if self.executor != "local":
            cmd += ["--executor", self.executor] + (["--ray-address", self.ray_address] if self.ray_address else [])
        if self.backend != "auto":  # auto is the stage CLI's default
            cmd += ["--backend", self.backend]
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
            env = {STORAGE_OPTIONS_ENV: json.dumps(self.options())} if self.options() else None
            client = PipesSubprocessClient(env=env)
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
