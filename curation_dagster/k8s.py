"""Stage partitions as Kubernetes pods: a program's declared ``Resources`` become its pod.

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

``kubernetes`` and ``dagster_k8s`` are imported inside functions, so definitions load without them.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from stages.catalog import PROGRAMS, Resources, partition_name

if TYPE_CHECKING:
    from dagster import AssetExecutionContext, Definitions, MaterializeResult

    from curation_dagster.resources import CurationResource

ENV_PREFIX = "CURATE_K8S_"
CONTAINER = "stage"
LABEL_PREFIX = "curation-dagster.io"
# What build_pod_body puts first in the container's env; its values are set per run.
PIPES_ENV = ("DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES")
RENDER_RUN_ID = "00000000-0000-0000-0000-000000000000"
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


def stage_command(curation: CurationResource, program: str, crawl: str, source: str | None) -> list[str]:
    """``python -m stages ...`` for one partition; ``--workers 0`` ("every core") becomes the
    pod's CPU request."""
    cmd = ["python", *curation.command(program, crawl, source)]
    if "--workers" in cmd:
        i = cmd.index("--workers") + 1
        if cmd[i] == "0":
            cmd[i] = str(threads(PROGRAMS[program].resources))
    return cmd


def pod_arguments(
    settings: K8sSettings, curation: CurationResource, program: str, crawl: str, source: str | None
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


# Waiting reasons dagster-k8s fails on at once (with the pod's events): nothing to bound there.
FAILS_AT_ONCE = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff",
                           "RunContainerError"})


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _gpus(spec: Mapping[str, Any]) -> str | None:
    limits: dict[str, str] = spec["containers"][0].get("resources", {}).get("limits", {})
    return limits.get(GPU_RESOURCE)


def pending_reason(pod: Any, spec: Mapping[str, Any]) -> str:
    """Why a pod is still Pending, in one line: the scheduler's condition, else its container's
    waiting reason. ``pod`` is the API client's ``V1Pod`` (None when it is gone); ``spec`` the
    PodSpec we submitted (camelCase), for what a GPU pod asked for."""
    if pod is None or pod.status is None:
        return "the pod is gone" if pod is None else "no status yet"
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            why = f"unschedulable: {_one_line(cond.message or cond.reason or 'no reason given')}"
            gpus = _gpus(spec)
            if gpus:  # say what it asked for: the scheduler's counts do not name the selector
                why += (f" (no node with {gpus} free {GPU_RESOURCE} matches nodeSelector "
                        f"{json.dumps(spec.get('nodeSelector', {}))} and tolerates the pod)")
            return why
    for c in pod.status.container_statuses or []:
        if c.state is not None and c.state.waiting is not None:
            waiting = c.state.waiting
            return _one_line(f"container {c.name} waiting: {waiting.reason}" + (
                f": {waiting.message}" if waiting.message else ""))
    return "not scheduled yet"


def wait_until_started(
    core_api: Any, namespace: str, pod_name: str, spec: Mapping[str, Any], partition: str, timeout_s: float,
    poll_s: float,
) -> None:
    """Return once the pod has left ``Pending`` (or is waiting for a reason dagster-k8s fails on
    by itself); after ``timeout_s`` (0: never) raise ``dagster.Failure`` with one line naming the
    partition and why the pod did not start."""
    deadline = time.monotonic() + timeout_s
    while True:
        pods = core_api.list_namespaced_pod(namespace=namespace, field_selector=f"metadata.name={pod_name}").items
        pod = pods[0] if pods else None
        status = pod.status if pod is not None else None
        if status is not None and status.phase not in (None, "Pending"):
            return
        waiting = [c.state.waiting.reason for c in (status.container_statuses if status else None) or []
                   if c.state and c.state.waiting]
        if FAILS_AT_ONCE.intersection(waiting):
            return
        if timeout_s and time.monotonic() >= deadline:
            from dagster import Failure

            kind = "GPU pod" if _gpus(spec) else "pod"
            raise Failure(description=f"{partition}: {kind} {pod_name} not started after {timeout_s:g}s, "
                                      f"{pending_reason(pod, spec)}; the bound is {ENV_PREFIX}PENDING_TIMEOUT_S")
        time.sleep(poll_s)


def pipes_client(settings: K8sSettings, spec: Mapping[str, Any], partition: str) -> Any:
    """dagster-k8s's ``PipesK8sClient``, whose wait for the pod to start is bounded by
    ``settings.pending_timeout_s`` (:func:`wait_until_started`): ``PipesK8sClient.run`` waits for
    a pod to appear with containers for up to 24 h, whatever its ``pod_wait_timeout``. A failure
    here deletes the pod (``run`` deletes it on any error)."""
    from dagster_k8s import PipesK8sClient

    class StartBoundedPipesK8sClient(PipesK8sClient):
        @contextmanager
        def consume_pod_logs(  # type: ignore[no-untyped-def]
            self, context, client, namespace, pod_name, enable_multi_container_logs=False, ignore_containers=None,
        ) -> Iterator[None]:
            wait_until_started(client.core_api, namespace, pod_name, spec, partition, settings.pending_timeout_s,
                               settings.poll_interval_s)
            with super().consume_pod_logs(context, client, namespace, pod_name, enable_multi_container_logs,
                                          ignore_containers):
                yield

    return StartBoundedPipesK8sClient(kubeconfig_file=settings.kubeconfig_file, poll_interval=settings.poll_interval_s)


def materialize_in_pod(
    context: AssetExecutionContext, curation: CurationResource, program: str, crawl: str, source: str | None,
    settings: K8sSettings | None = None,
) -> MaterializeResult:
    """Run one partition in its own pod through ``PipesK8sClient`` and return what it reported."""
    settings = settings or K8sSettings.from_env()
    arguments = pod_arguments(settings, curation, program, crawl, source)
    client = pipes_client(settings, arguments["base_pod_spec"], partition_name(program, crawl, source))
    invocation = client.run(context=context, pod_wait_timeout=settings.pod_wait_timeout_s, **arguments)
    return invocation.get_materialize_result()


def pod_manifest(
    settings: K8sSettings, curation: CurationResource, program: str, crawl: str, source: str | None,
    run_id: str = RENDER_RUN_ID,
) -> dict[str, Any]:
    """The Pod ``PipesK8sClient.run`` submits, built by the function it uses (``build_pod_body``),
    serialised as the API client sends it. Per run: the pod name's run id and random suffix (zeros
    here) and the values of the two Dagster Pipes variables (placeholders here)."""
    from dagster_k8s.pipes import build_pod_body, get_pod_name
    from kubernetes.client import ApiClient

    args = pod_arguments(settings, curation, program, crawl, source)
    name = get_pod_name(run_id, program)
    name = name[: name.rindex("-") + 1] + "0" * 10
    pod = build_pod_body(
        pod_name=name, image=None, command=args["command"],
        env_vars={k: f"<set per run by Dagster Pipes: {k}>" for k in PIPES_ENV},
        base_pod_meta=args["base_pod_meta"], base_pod_spec=args["base_pod_spec"],
    )
    body: dict[str, Any] = ApiClient().sanitize_for_serialization(pod)
    # The API client sends the bare model; name the kind so the manifest can be applied as is.
    return {"apiVersion": "v1", "kind": "Pod", **body}


def _yaml(docs: list[dict[str, Any]], comments: list[str] | None = None) -> str:
    import yaml

    out = []
    for i, doc in enumerate(docs):
        head = f"# {comments[i]}\n" if comments else ""
        out.append(head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return "---\n".join(out)


def render(
    curation: CurationResource, asset: str | None = None, crawl: str = "example", source: str = "example",
    settings: K8sSettings | None = None,
) -> str:
    """YAML of the pod of one asset's partition (or of every asset's), as it would be submitted."""
    settings = settings or K8sSettings.from_env()
    names = [asset] if asset else list(PROGRAMS)
    docs, comments = [], []
    for name in names:
        if name not in PROGRAMS:
            raise KeyError(f"unknown asset {name!r}; known: {', '.join(PROGRAMS)}")
        src = source if PROGRAMS[name].level == "source" else None
        docs.append(pod_manifest(settings, curation, name, crawl, src))
        comments.append(f"{partition_name(name, crawl, src)} -> POST /api/v1/namespaces/{settings.namespace}/pods")
    return _yaml(docs, comments)


def code_location_resource(workdir: str, data_root: str | None) -> CurationResource:
    """The ``curation`` resource of the Kubernetes code location (see :func:`definitions`)."""
    from curation_dagster.resources import CurationResource

    return CurationResource(workdir=os.path.abspath(workdir), data_root=data_root or None, mode="k8s")


def render_cli(
    workdir: str, data_root: str | None, asset: str | None, crawl: str, source: str
) -> str:
    """``curate k8s render``: the pods of the code location's resource, settings from the env."""
    return render(code_location_resource(workdir, data_root), asset, crawl, source)


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
    head = "# Generated by `curate k8s render --templates k8s` from curation_dagster/k8s.py; do not edit.\n"
    return {
        "stage-pods.yaml": head + _yaml(pod_templates(settings)),
        "raycluster.yaml": head + _yaml([ray_cluster(settings)]),
    }


def write_templates(directory: str | Path, settings: K8sSettings | None = None) -> list[Path]:
    out = []
    for name, text in static_manifests(settings).items():
        path = Path(directory) / name
        path.write_text(text)
        out.append(path)
    return out


def definitions() -> Definitions:
    """The code location on Kubernetes (``dagster api grpc -m curation_dagster.k8s -a definitions``):
    the same assets, every partition in its own pod; outputs under ``CURATE_DATA_ROOT``."""
    from curation_dagster.definitions import build_definitions

    # Everything the local code location has (assets, checks, schedules, sensors); only the
    # resource's mode and data root differ, as code_location_resource() builds them.
    return build_definitions(
        os.environ.get("CURATE_WORKDIR", "/workdir"), mode="k8s",
        data_root=os.environ.get("CURATE_DATA_ROOT") or None,
        # Ray-backed stages (docs/scale-out.md): e.g. CURATE_EXECUTOR=ray and
        # CURATE_RAY_ADDRESS=ray://curation-ray-head-svc.curation.svc:10001 (k8s/raycluster.yaml).
        executor=os.environ.get("CURATE_EXECUTOR") or "local",
        ray_address=os.environ.get("CURATE_RAY_ADDRESS") or None,
    )
