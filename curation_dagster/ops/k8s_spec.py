"""Program partitions as Kubernetes pods, rendered from settings: a program's declared ``Resources``
become its pod spec. Pure: no ``kubernetes`` or ``dagster_k8s`` import, no Dagster definitions;
``curation_dagster.defs.launchers.k8s`` submits what is built here.

In production each asset partition runs in its own pod, submitted by dagster-k8s's
``PipesK8sClient`` from the Dagster run (``CurationResource(mode="k8s")``): the CPU or GPU stage
image runs ``python -m stages PROGRAM --crawl ... --data-root ... [--source ...]`` and reports its
materialization back over Dagster Pipes (the pod's log stream). Asset code is the same as local.

One function, :func:`pod_spec`, turns ``stages.catalog.Resources`` into the pod spec:

- requests ``cpu`` and ``memory`` (memory also as the limit; no CPU limit, so a stage is not
  throttled below what the node has spare); ``gpu > 0`` adds the ``nvidia.com/gpu`` limit, the GPU
  image, the GPU node selector and the GPU tolerations;
- non-root, read-only root filesystem, no privilege escalation, every capability dropped,
  ``RuntimeDefault`` seccomp, no service-account token; writable ``emptyDir`` volumes for ``/tmp``
  and the cache directory; no shared volume: the crawl's spec and every output are in the data
  root (``stages.dataroot``), usually object storage;
- credentials only through ``envFrom`` Secret references: never in the command line, the
  environment values or the metadata.

Settings (images, namespace, Secrets, node selectors, ...) come from ``CURATE_K8S_*`` environment
variables (:class:`K8sSettings`), which the Helm values set on the code location and so on every run.
``curate k8s render`` prints the exact pods that would be submitted.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from stages.catalog import PROGRAMS, Resources

ENV_PREFIX = "CURATE_K8S_"
CONTAINER = "stage"
LABEL_PREFIX = "curation-dagster.io"
GPU_RESOURCE = "nvidia.com/gpu"


class K8sSettings(BaseModel):
    """Where and how stage pods run. Each field is read from ``CURATE_K8S_<FIELD>`` (upper case;
    lists, dicts, numbers and ``null`` as JSON), e.g. ``CURATE_K8S_GPU_IMAGE``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = "curation"
    cpu_image: str = "curation-dagster/stage-cpu:0.1.0"
    gpu_image: str = "curation-dagster/stage-gpu:0.1.0"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    # Secrets whose keys become environment variables of the stage (envFrom): S3 keys, tokens.
    secrets: tuple[str, ...] = ("curation-credentials",)
    # A PersistentVolumeClaim (ReadWriteMany) mounted at the workdir path in every stage pod: only
    # for a data root on a shared POSIX volume. Crawl specs live in the data root, so a data root
    # on object storage needs no volume at all.
    workdir_claim: str | None = None
    cache_dir: str = "/cache"
    tmp_dir: str = "/tmp"
    cache_gib: float = 16.0
    tmp_gib: float = 8.0
    run_as_user: int = 10001
    cpu_node_selector: dict[str, str] = {}
    cpu_tolerations: tuple[dict[str, str], ...] = ()
    gpu_node_selector: dict[str, str] = {"nvidia.com/gpu.present": "true"}
    gpu_tolerations: tuple[dict[str, str], ...] = (
        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
    )
    priority_class: str | None = None
    active_deadline_s: int | None = None
    # How the run talks to the API server: in-cluster by default, a kubeconfig file otherwise.
    kubeconfig_file: str | None = None
    poll_interval_s: float = 5.0
    # How long a stage pod may stay Pending (unscheduled, or its container not started) before its
    # step fails with the scheduler's reason; 0: no bound. dagster-k8s itself waits 24 h for a
    # pod that never schedules, e.g. a GPU pod on a cluster with no free GPU node. Dagster's run
    # retries (k8s/values.yaml) then try again; raise it where pods queue for long on purpose
    # (a busy GPU pool, a slow node autoscaler).
    pending_timeout_s: float = 900.0
    # How long a started pod may run (dagster-k8s's pod_wait_timeout).
    pod_wait_timeout_s: float = 86_400.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> K8sSettings:
        """Settings from ``CURATE_K8S_*`` variables; an unknown one is an error (a typo would
        otherwise silently fall back to a default)."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for key, raw in environ.items():
            if not key.startswith(ENV_PREFIX):
                continue
            name = key[len(ENV_PREFIX):].lower()
            if name not in cls.model_fields:
                raise ValueError(f"unknown setting {key}; known: {', '.join(_env_names())}")
            if cls.model_fields[name].annotation is str:
                values[name] = raw
            else:  # JSON for numbers, lists, dicts, null; a plain word for a Literal or a path
                try:
                    values[name] = json.loads(raw)
                except json.JSONDecodeError:
                    values[name] = raw
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ValueError(f"invalid {ENV_PREFIX}* settings: {exc}") from exc


def _env_names() -> list[str]:
    return [ENV_PREFIX + name.upper() for name in K8sSettings.model_fields]


def _cpu(cores: float) -> str:
    return f"{round(cores * 1000)}m"


def _memory(gib: float) -> str:
    return f"{round(gib * 1024)}Mi"


def threads(resources: Resources) -> int:
    """Worker processes/threads for a pod: its CPU request (the node's core count, which is
    what ``os.cpu_count()`` sees inside a pod, would oversubscribe it)."""
    return max(1, math.ceil(resources.cpu))


def pod_spec(
    settings: K8sSettings, resources: Resources, workdir: str, name: str = "stage"
) -> dict[str, Any]:
    """The PodSpec (camelCase, as Kubernetes writes it) of one stage task, without its command.

    ``gpu > 0`` needs the GPU image (``image="gpu"``): CUDA libraries are only there.
    """
    gpu = resources.gpu > 0
    if gpu and resources.image != "gpu":
        raise ValueError(f"{name}: gpu={resources.gpu} needs image='gpu' (the CPU image has no CUDA)")
    requests = {"cpu": _cpu(resources.cpu), "memory": _memory(resources.memory_gib)}
    limits = {"memory": _memory(resources.memory_gib)}
    if gpu:
        # Extended resources are never overcommitted: request and limit must be equal.
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(resources.gpu)
    n = str(threads(resources))
    env = [
        {"name": "HOME", "value": settings.tmp_dir},
        {"name": "TMPDIR", "value": settings.tmp_dir},
        {"name": "XDG_CACHE_HOME", "value": settings.cache_dir},
        {"name": "NUMBA_CACHE_DIR", "value": f"{settings.cache_dir}/numba"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "OMP_NUM_THREADS", "value": n},
        {"name": "NUMBA_NUM_THREADS", "value": n},
    ]
    mounts = [
        {"name": "tmp", "mountPath": settings.tmp_dir},
        {"name": "cache", "mountPath": settings.cache_dir},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {"sizeLimit": _memory(settings.tmp_gib)}},
        {"name": "cache", "emptyDir": {"sizeLimit": _memory(settings.cache_gib)}},
    ]
    if settings.workdir_claim:
        mounts.append({"name": "workdir", "mountPath": workdir})
        volumes.append({"name": "workdir", "persistentVolumeClaim": {"claimName": settings.workdir_claim}})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.gpu_image if resources.image == "gpu" else settings.cpu_image,
        "imagePullPolicy": settings.image_pull_policy,
        "env": env,
        "resources": {"requests": requests, "limits": limits},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    if settings.secrets:
        container["envFrom"] = [{"secretRef": {"name": s}} for s in settings.secrets]
    spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",  # a failed task is retried by Dagster, which sees the failure
        "automountServiceAccountToken": False,  # a stage never talks to the Kubernetes API
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "runAsGroup": settings.run_as_user,
            "fsGroup": settings.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": volumes,
    }
    node_selector = settings.gpu_node_selector if gpu else settings.cpu_node_selector
    tolerations = settings.gpu_tolerations if gpu else settings.cpu_tolerations
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    if settings.priority_class:
        spec["priorityClassName"] = settings.priority_class
    if settings.active_deadline_s:
        spec["activeDeadlineSeconds"] = settings.active_deadline_s
    return spec


def pod_meta(program: str, crawl: str, source: str | None) -> dict[str, Any]:
    """Labels select (program, kind); crawl and source names go to annotations (up to 128
    characters, longer than a label value may be). No credentials here, ever."""
    res = PROGRAMS[program].resources
    annotations = {f"{LABEL_PREFIX}/crawl": crawl}
    if source is not None:
        annotations[f"{LABEL_PREFIX}/source"] = source
    return {
        "labels": {
            "app.kubernetes.io/component": "curation-stage",
            f"{LABEL_PREFIX}/program": program,
            f"{LABEL_PREFIX}/image": res.image,
        },
        "annotations": annotations,
    }


class StageCommands(Protocol):
    """What a stage pod is built from (``CurationResource`` is one): the partition's command line
    and the workdir, where a shared volume is mounted if there is one."""

    @property
    def workdir(self) -> str: ...

    def command(self, program: str, crawl: str, source: str | None) -> list[str]: ...


def stage_command(curation: StageCommands, program: str, crawl: str, source: str | None) -> list[str]:
    """``python -m stages ...`` for one partition; ``--workers 0`` ("every core") becomes the
    pod's CPU request."""
    cmd = ["python", *curation.command(program, crawl, source)]
    if "--workers" in cmd:
        i = cmd.index("--workers") + 1
        if cmd[i] == "0":
            cmd[i] = str(threads(PROGRAMS[program].resources))
    return cmd


def pod_arguments(
    settings: K8sSettings, curation: StageCommands, program: str, crawl: str, source: str | None
) -> dict[str, Any]:
    """The keyword arguments of ``PipesK8sClient.run`` for one partition (besides the context)."""
    if program not in PROGRAMS:
        raise KeyError(f"unknown asset {program!r}; known: {', '.join(PROGRAMS)}")
    return {
        "command": stage_command(curation, program, crawl, source),
        "namespace": settings.namespace,
        "base_pod_meta": pod_meta(program, crawl, source),
        "base_pod_spec": pod_spec(settings, PROGRAMS[program].resources, curation.workdir, program),
    }


def to_yaml(docs: list[dict[str, Any]], comments: list[str] | None = None) -> str:
    import yaml

    out = []
    for i, doc in enumerate(docs):
        head = f"# {comments[i]}\n" if comments else ""
        out.append(head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return "---\n".join(out)


# Shapes of the checked-in pod templates (k8s/stage-pods.yaml) and Ray workers.
TEMPLATE_RESOURCES = {
    "cpu": Resources(cpu=2.0, memory_gib=8.0),
    "gpu": Resources(cpu=8.0, memory_gib=32.0, gpu=1, image="gpu"),
}


def pod_templates(settings: K8sSettings, workdir: str = "/workdir") -> list[dict[str, Any]]:
    """``PodTemplate`` objects of a CPU and a GPU stage pod (``kubectl apply``-able references;
    stage pods themselves are built per partition by :func:`pod_spec`)."""
    out = []
    for kind, res in TEMPLATE_RESOURCES.items():
        spec = pod_spec(settings, res, workdir, f"stage-{kind}")
        spec["containers"][0]["command"] = ["python", "-m", "stages", "--help"]
        out.append({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": f"curation-stage-{kind}", "namespace": settings.namespace,
                         "labels": {"app.kubernetes.io/component": "curation-stage",
                                    f"{LABEL_PREFIX}/image": res.image}},
            "template": {"metadata": {"labels": {"app.kubernetes.io/component": "curation-stage",
                                                 f"{LABEL_PREFIX}/image": res.image}},
                         "spec": spec},
        })
    return out


RAY_VERSION = "2.60.0"  # = the ray pinned in pyproject.toml (extra "ray")


def _ray_pod(settings: K8sSettings, res: Resources, workdir: str, head: bool) -> dict[str, Any]:
    """A Ray head or worker pod template: the stage pod's hardening, the stage image, Ray's ports,
    and a memory-backed ``/dev/shm`` for the object store."""
    spec = pod_spec(settings, res, workdir, "ray-head" if head else "ray-worker")
    container = spec["containers"][0]
    container["name"] = "ray-head" if head else "ray-worker"
    if head:
        container["ports"] = [
            {"containerPort": 6379, "name": "gcs-server"},
            {"containerPort": 8265, "name": "dashboard"},
            {"containerPort": 10001, "name": "client"},
        ]
    container["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    spec["volumes"].append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _memory(res.memory_gib / 4)}})
    spec.pop("restartPolicy")  # KubeRay owns the restart policy of its pods
    if head:  # the in-tree autoscaler runs beside the head and scales workers through the API
        spec["automountServiceAccountToken"] = True
    return {"spec": spec}


def ray_cluster(settings: K8sSettings, workdir: str = "/workdir") -> dict[str, Any]:
    """A KubeRay ``RayCluster`` for Ray-backed stages: a CPU head (schedules nothing itself), an
    autoscaled CPU worker group and an autoscaled GPU worker group in the stage images."""
    head_res = Resources(cpu=2.0, memory_gib=8.0)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "curation-ray", "namespace": settings.namespace,
                     "labels": {"app.kubernetes.io/component": "curation-ray"}},
        "spec": {
            "rayVersion": RAY_VERSION,
            "enableInTreeAutoscaling": True,
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                "template": _ray_pod(settings, head_res, workdir, head=True),
            },
            "workerGroupSpecs": [
                {
                    "groupName": f"{kind}-workers",
                    "replicas": 0,
                    "minReplicas": 0,
                    "maxReplicas": 16 if kind == "cpu" else 4,
                    "rayStartParams": {},
                    "template": _ray_pod(settings, res, workdir, head=False),
                }
                for kind, res in TEMPLATE_RESOURCES.items()
            ],
        },
    }


def static_manifests(settings: K8sSettings | None = None) -> dict[str, str]:
    """The generated files of ``k8s/`` by name (``curate k8s render --templates k8s`` writes them)."""
    settings = settings or K8sSettings()
    head = "# Generated by `curate k8s render --templates k8s` from curation_dagster/ops/k8s_spec.py; do not edit.\n"
    return {
        "stage-pods.yaml": head + to_yaml(pod_templates(settings)),
        "raycluster.yaml": head + to_yaml([ray_cluster(settings)]),
    }


def write_templates(directory: str | Path, settings: K8sSettings | None = None) -> list[Path]:
    out = []
    for name, text in static_manifests(settings).items():
        path = Path(directory) / name
        path.write_text(text)
        out.append(path)
    return out
