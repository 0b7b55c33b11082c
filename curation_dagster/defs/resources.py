"""The ``curation`` resource: where the workdir is and how a stage task is executed.

Environments differ only here (local folder or ``s3://``, in this process, a ``python -m stages``
subprocess speaking Dagster Pipes or a Kubernetes pod: ``curation_dagster.defs.launchers``; a process
pool or a Ray cluster), never in asset code. :func:`resource_for` builds a code location's
resource from its environment, for the definitions and ``curate k8s render`` alike.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from dagster import AssetExecutionContext, ConfigurableResource, Failure, OpExecutionContext
from pydantic import Field

from curation_dagster.ops.k8s_spec import threads
from curation_dagster.ops.location import workdir_from
from curation_dagster.run.place import Place
from stages.catalog import PROGRAMS
from stages.cli import PARENT_PID_ENV, SERVE
from stages.credentials import STORAGE_OPTIONS_ENV, storage_options
from stages.dataroot import DATA_ROOT_ENV, DataRoot, UnknownCrawl, data_root_url
from stages.parallel import usable_cores
from stages.params import ExecutionParams, workdir_tuning
from stages.spec import CrawlSpec
from stages.store import Store


def load_spec(workdir: str | Path, crawl: str) -> CrawlSpec:
    """The spec of ``crawl`` in the data root of ``workdir`` (the embedded default)."""
    try:
        return DataRoot.open(workdir=workdir).spec(crawl)
    except UnknownCrawl as exc:
        raise Failure(str(exc)) from exc


def save_spec(workdir: str | Path, spec: CrawlSpec) -> str:
    """Register ``spec`` in the data root of ``workdir``; returns the record's path."""
    root = DataRoot.open(workdir=workdir)
    root.register(spec)
    return root.record_path(spec.crawl)


K8S_FAN_OUT = 8  # stage pods of a step at once under Kubernetes, where fan_out is 0


class CurationResource(ConfigurableResource):  # type: ignore[type-arg]
    """Workdir (operating config), data root (crawl specs, outputs) and execution settings of stage tasks.

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
    mode: Literal["in_process", "pipes", "k8s"] = "in_process"  # where a partition runs: the warm pool, a
    # warm Pipes worker (python -m stages serve), a pod (curation_dagster.run.crawl_job)
    # pipes, k8s: at most this many partitions of one step at once (warm workers, pods); 0: pipes one
    # worker per core of the run worker's machine (they share it), k8s K8S_FAN_OUT pods (``fan_out_now``)
    fan_out: int = 0
    partition_retries: int = 1  # pipes: launches again of a partition whose process was killed by a signal
    # k8s: small partitions packed into one pod, in turn, up to this many input documents (their
    # source's, as ingested) a pack; 0: one partition per pod. (pipes: warm workers serve many each)
    pack_documents: int = 0
    batch_rows: int = 20_000
    workers: int = 0  # 0 = every core
    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    backend: Literal["auto", "cpu", "gpu"] = "auto"  # kernels: auto = the GPU twins where torch sees CUDA

    def dataroot(self) -> DataRoot:
        """The data root (``stages.dataroot.DataRoot.open``: this resource's data root, else
        ``$CURATE_DATA_ROOT``, else the workdir's) with the crawl registry on it."""
        return DataRoot.open(self.data_root, self.workdir, self.storage_options)

    def root(self) -> str:
        return data_root_url(self.data_root, self.workdir)

    def options(self) -> dict[str, Any]:
        """``storage_options``, else ``$CURATE_STORAGE_OPTIONS`` (JSON), else none."""
        return storage_options(self.storage_options)

    def place(self) -> Place:
        """The workdir, data root and storage options as resolved here: what a pool worker, which
        imports no Dagster, reads and writes through."""
        return Place.of(self.workdir, self.data_root, self.storage_options)

    def store(self) -> Store:
        """The data root's outputs; its storage options also become this process's fsspec
        defaults for its protocol, so source URLs there open alike."""
        return self.dataroot().store

    def spec(self, crawl: str) -> CrawlSpec:
        try:
            return self.dataroot().spec(crawl)
        except UnknownCrawl as exc:
            raise Failure(str(exc)) from exc

    def execution(self) -> ExecutionParams:
        execution = ExecutionParams(batch_rows=self.batch_rows, workers=self.workers, executor=self.executor,
                                    ray_address=self.ray_address, backend=self.backend)
        return workdir_tuning(self.workdir).apply(execution)  # curate.yaml's execution: section

    def command(self, program: str, crawl: str, source: str | None) -> list[str]:
        """The stage command line: what a subprocess or a Kubernetes pod runs for one partition.
        It needs nothing but the data root (the spec is there) and names the workdir's
        execution tuning itself, so a pod mounts no workdir."""
        cmd = ["-m", "stages", program, "--crawl", crawl, "--data-root", self.root(),
               "--batch-rows", str(self.batch_rows), "--workers", str(self.workers)]
        tuning = workdir_tuning(self.workdir).model_dump(exclude_none=True)
        if tuning:  # not secret: sizes of batches and blocks
            cmd += ["--tuning", json.dumps(tuning, sort_keys=True)]
        if self.executor != "local":
            cmd += ["--executor", self.executor] + (["--ray-address", self.ray_address] if self.ray_address else [])
        if self.backend != "auto":  # auto is the stage CLI's default
            cmd += ["--backend", self.backend]
        return cmd + (["--source", source] if source is not None else [])

    def launch(self, context: OpExecutionContext | AssetExecutionContext, program: str, crawl: str,
               sources: list[str | None], force: bool = False) -> dict[str | None, dict[str, Any]]:
        """Launch a pod through ``PipesK8sClient`` for the partitions of ``sources`` (one, or a pack
        of small ones, in turn; ``mode="k8s"``) and return what it reported over Pipes of each:
        ``skipped``, ``seconds``, ``data_version``, or ``error`` (one line). ``mode="pipes"`` runs
        partitions on warm workers (``serve_command``), ``in_process`` in this process's pool."""
        if self.mode != "k8s":
            raise ValueError(f"mode {self.mode!r} does not launch a pod per partition: only k8s does")
        from curation_dagster.defs.launchers import k8s  # imports kubernetes only here

        return k8s.launch(context, self, program, crawl, sources, force=force)

    def fan_out_now(self) -> int:
        """At most this many partitions of a step at once outside this process: ``fan_out``, else
        (0) in pipes mode one warm worker per core this process may use: they run beside it on
        its machine, and more processes than cores only share them (measured: 200 sources on 2
        cores, 8 workers 1.65x ``curate run``'s wall time, 2 workers 1.16x; docs/operations.md);
        under Kubernetes ``K8S_FAN_OUT`` pods, each on the CPUs it requests."""
        if self.fan_out > 0:
            return self.fan_out
        return usable_cores() if self.mode == "pipes" else K8S_FAN_OUT

    def stage_workers(self, program: str) -> int:
        """The cores a partition of ``program`` runs on outside this process: ``workers``, else
        its pod's CPU request (``curation_dagster.ops.k8s_spec.stage_command``)."""
        return self.workers or threads(PROGRAMS[program].resources)

    def serve_command(self, crawl: str) -> tuple[list[str], dict[str, str]]:
        """A warm worker of ``crawl`` (``python -m stages serve``: the stage pod's entry point and
        settings, partitions asked for on its stdin, ``curation_dagster.defs.launchers.pipes.Worker``)
        and what it adds to this environment: the pod's thread settings for the widest program
        (each partition is held to its own, ``stage_workers``)."""
        widest = str(max(threads(p.resources) for p in PROGRAMS.values()))
        env = {"OMP_NUM_THREADS": widest, "NUMBA_NUM_THREADS": widest, "PYTHONUNBUFFERED": "1"}
        return [sys.executable, *self.command(SERVE, crawl, None)], self._subprocess_env(env)

    def _subprocess_env(self, env: dict[str, str]) -> dict[str, str]:
        if self.options():
            env[STORAGE_OPTIONS_ENV] = json.dumps(self.options())
        # A run worker that dies (SIGKILL, OOM) takes its stage subprocess with it: the run's
        # retry writes the partition again, and must find no writer of it still running.
        env[PARENT_PID_ENV] = str(os.getpid())
        return env


# Where a code location's environment configures its resource (docs/scale-out.md for the Ray ones:
# e.g. CURATE_EXECUTOR=ray, CURATE_RAY_ADDRESS=ray://curation-ray-head-svc.curation.svc:10001).
EXECUTOR_ENV = "CURATE_EXECUTOR"
RAY_ADDRESS_ENV = "CURATE_RAY_ADDRESS"
# A crawl step's launching (warm Pipes workers, pods): partitions at once, documents a pack.
FAN_OUT_ENV = "CURATE_FAN_OUT"
PACK_DOCUMENTS_ENV = "CURATE_PACK_DOCUMENTS"


def resource_for(env: Mapping[str, str], **fields: Any) -> CurationResource:
    """The ``curation`` resource of a code location whose environment is ``env``: the workdir
    (``curation_dagster.ops.location.workdir_from``; ``/workdir`` by default in a pod, ``mode="k8s"``),
    ``$CURATE_DATA_ROOT``, ``$CURATE_EXECUTOR``, ``$CURATE_RAY_ADDRESS``, ``$CURATE_FAN_OUT`` and
    ``$CURATE_PACK_DOCUMENTS``; ``fields`` (resource
    fields: ``mode``, ``workdir``, ...) take precedence. The definitions of every code location and
    ``curate k8s render`` build theirs here, so a rendered pod is the one the resource launches."""
    values: dict[str, Any] = {
        "workdir": workdir_from(env, "/workdir" if fields.get("mode") == "k8s" else "workdir"),
        "data_root": env.get(DATA_ROOT_ENV) or None,
        "executor": env.get(EXECUTOR_ENV) or "local",
        "ray_address": env.get(RAY_ADDRESS_ENV) or None,
        **{name: int(env[var]) for name, var in (("fan_out", FAN_OUT_ENV), ("pack_documents", PACK_DOCUMENTS_ENV))
           if env.get(var)},
        **fields,
    }
    values["workdir"] = os.path.abspath(values["workdir"])
    return CurationResource(**values)
