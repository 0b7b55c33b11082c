"""Run a program's partition in its own Kubernetes pod through dagster-k8s's ``PipesK8sClient``, and
render the pods it would submit (``curate k8s render``). The pod itself is ``curation_dagster.ops.k8s_spec``'s.

``kubernetes`` and ``dagster_k8s`` are imported inside functions, so definitions load without them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dagster import AssetExecutionContext, Failure, OpExecutionContext

from curation_dagster.ops.k8s_spec import ENV_PREFIX, GPU_RESOURCE, K8sSettings, StageCommands, pod_arguments, to_yaml
from stages.catalog import PROGRAMS, partition_name

# What build_pod_body puts first in the container's env; its values are set per run.
PIPES_ENV = ("DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES")
RENDER_RUN_ID = "00000000-0000-0000-0000-000000000000"


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


def launch(
    context: OpExecutionContext | AssetExecutionContext, curation: StageCommands, program: str, crawl: str,
    sources: list[str | None], settings: K8sSettings | None = None, force: bool = False,
) -> dict[str | None, dict[str, Any]]:
    """Run the partitions of ``sources`` (one, or a pack of small ones) in one pod through
    ``PipesK8sClient``; what it reported over Pipes of each. The pod is the first source's, its
    command names every source."""
    from curation_dagster.defs.launchers.pipes import reported

    settings = settings or K8sSettings.from_env()
    arguments = pod_arguments(settings, curation, program, crawl, sources[0])
    for source in sources[1:]:
        arguments["command"] = [*arguments["command"], "--source", str(source)]
    if force:
        arguments["command"] = [*arguments["command"], "--force"]
    client = pipes_client(settings, arguments["base_pod_spec"], partition_name(program, crawl, sources[0]))
    try:
        invocation = client.run(context=context, pod_wait_timeout=settings.pod_wait_timeout_s, **arguments)
    except Exception as exc:
        # A pod that exited with an error: dagster-k8s's error holds its last log lines, the Pipes
        # messages among them; a stage's own error is reported there, on one line.
        messages = _custom_messages(str(exc))
        if not messages:
            raise
        return reported(messages, sources, code=1)
    return reported(invocation.get_custom_messages(), sources)


def _custom_messages(log: str) -> list[Any]:
    """The payloads of the Pipes ``report_custom_message`` lines in a pod's log text."""
    out = []
    for line in log.splitlines():
        start = line.find('{"__dagster_pipes_version"')
        if start < 0:
            continue
        try:
            message = json.loads(line[start:])
        except ValueError:
            continue
        if message.get("method") == "report_custom_message":
            out.append(message.get("params", {}).get("payload"))
    return out


def pod_manifest(
    settings: K8sSettings, curation: StageCommands, program: str, crawl: str, source: str | None,
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


def render(
    curation: StageCommands, asset: str | None = None, crawl: str = "example", source: str = "example",
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
    return to_yaml(docs, comments)
