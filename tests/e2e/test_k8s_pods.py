"""End to end on an emulated Kubernetes: dagster-k8s submits stage pods, a pod runner runs them.

``FakeCluster`` is a Kubernetes API on 127.0.0.1 with just the endpoints dagster-k8s's
``PipesK8sClient`` calls (create/list/read/delete pods, pod logs, events), plus a pod runner
playing scheduler and kubelet: it places each pod on an emulated node (node selector, taints and
tolerations, ``nvidia.com/gpu`` capacity), "pulls" only the images it knows, resolves ``env`` and
``envFrom`` Secrets, creates ``emptyDir`` directories, refuses ``runAsNonRoot`` pods that would
run as root, then runs the container's command as a local subprocess with the pod's environment
and serves its stdout/stderr as the pod log (with the timestamps dagster-k8s parses). Every
created pod must validate strictly against the Kubernetes 1.32 schema, as the API server would
reject it otherwise. What this does not prove is in docs/kubernetes.md.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import threading
import time
import typing
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes
import kubernetes_validate
import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, Failure, materialize

from curation_dagster.defs.assets import ASSETS
from curation_dagster.defs.launchers import k8s
from curation_dagster.defs.partitions import CRAWL, SOURCE, partition_key
from curation_dagster.defs.resources import CurationResource, save_spec
from curation_dagster.ops import k8s_spec
from stages import catalog
from stages import params as P
from stages.catalog import Resources
from stages.dataroot import DataRoot
from stages.resolve import resolve_task
from stages.spec import CrawlSpec
from tests.support.metadata import md_table

NAMESPACE = "curation"
CPU_IMAGE = "registry.test/curation/stage-cpu:e2e"
GPU_IMAGE = "registry.test/curation/stage-gpu:e2e"
SECRET_VALUE = "planted-secret-4f1c9"  # must reach the process env, never a manifest
IMAGE_USER = 10001  # USER of docker/Dockerfile.*


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Node:
    labels: dict[str, str]
    taints: list[dict[str, str]] = field(default_factory=list)
    gpus: int = 0
    gpus_used: int = 0


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, str]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("operator", "Equal") == "Exists" and (not t.get("key") or t["key"] == taint["key"]):
            return True
        if t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


class FakeCluster:
    """An in-memory Kubernetes API server and pod runner bound to 127.0.0.1 (see module doc)."""

    def __init__(self, nodes: dict[str, Node], images: dict[str, dict[str, str]]) -> None:
        self.nodes = nodes
        self.images = images  # image -> the environment its Dockerfile ENV sets
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        self.claims: set[tuple[str, str]] = set()
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self.posted: list[dict[str, Any]] = []  # pod bodies exactly as received
        self.requests: list[str] = []
        self.unhandled: list[str] = []
        self.envs: dict[str, dict[str, str]] = {}  # pod name -> environment its process got
        self.cond = threading.Condition()
        self._procs: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self._threads: list[threading.Thread] = []
        self._last_ns = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._serve = threading.Thread(target=self._server.serve_forever, name="fake-k8s-api", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeCluster:
        self._serve.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.cond:
            procs = list(self._procs.values())
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        self._server.shutdown()
        self._server.server_close()
        self._serve.join(timeout=5)
        for t in self._threads:
            t.join(timeout=10)

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": NAMESPACE}}],
        }))
        return path

    # --- the API ---------------------------------------------------------------------------

    def create_pod(self, ns: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.posted.append(copy.deepcopy(body))
        full = {"apiVersion": "v1", "kind": "Pod", **body}
        try:
            kubernetes_validate.validate(full, "1.32", strict=True)
        except kubernetes_validate.ValidationError as exc:
            return 422, _status(422, "Invalid", f"Pod is invalid: {exc}")
        spec = body["spec"]
        volumes = {v["name"] for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    return 422, _status(422, "Invalid", f"volumeMounts {m['name']!r} not found")
        name = body["metadata"]["name"]
        with self.cond:
            if (ns, name) in self.pods:
                return 409, _status(409, "AlreadyExists", f'pods "{name}" already exists')
            pod = copy.deepcopy(full)
            pod["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion="1")
            pod["status"] = {"phase": "Pending", "conditions": []}
            self.pods[(ns, name)] = pod
            self.logs[(ns, name)] = []
        t = threading.Thread(target=self._run_pod, args=(ns, name), name=f"kubelet-{name}", daemon=True)
        self._threads.append(t)
        t.start()
        return 201, pod

    def delete_pod(self, ns: str, name: str) -> tuple[int, dict[str, Any]]:
        with self.cond:
            pod = self.pods.pop((ns, name), None)
            proc = self._procs.get((ns, name))
            self.cond.notify_all()
        if pod is None:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        if proc is not None and proc.poll() is None:
            proc.kill()
        return 200, pod

    # --- scheduler and kubelet -------------------------------------------------------------

    def _set(self, ns: str, name: str, **status: Any) -> None:
        with self.cond:
            pod = self.pods.get((ns, name))
            if pod is not None:
                pod["status"].update(status)
                pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)
            self.cond.notify_all()

    def _container_status(self, c: dict[str, Any], state: dict[str, Any], ready: bool = False) -> list[dict[str, Any]]:
        return [{"name": c["name"], "image": c["image"], "imageID": "", "ready": ready, "restartCount": 0,
                 "started": "running" in state, "state": state}]

    def _schedule(self, pod: dict[str, Any]) -> tuple[str | None, str]:
        """The node the pod lands on, or None and kube-scheduler's message saying why none fits."""
        spec = pod["spec"]
        gpus = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)) for c in spec["containers"])
        why: Counter[str] = Counter()
        for name, node in self.nodes.items():
            untolerated = [t for t in node.taints
                           if t["effect"] == "NoSchedule" and not _tolerates(spec.get("tolerations", []), t)]
            if any(node.labels.get(k) != v for k, v in spec.get("nodeSelector", {}).items()):
                why["node(s) didn't match Pod's node affinity/selector"] += 1
            elif untolerated:
                t = untolerated[0]
                why[f"node(s) had untolerated taint {{{t['key']}: {t.get('value', '')}}}"] += 1
            elif gpus > node.gpus - node.gpus_used:
                why["Insufficient nvidia.com/gpu"] += 1
            else:
                node.gpus_used += gpus
                return name, ""
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(why.items()))
        return None, f"0/{len(self.nodes)} nodes are available: {reasons}."

    def _env(self, ns: str, c: dict[str, Any]) -> dict[str, str]:
        env = dict(self.images[c["image"]])
        for source in c.get("envFrom", []):
            ref = source.get("secretRef")
            if ref is None:
                raise LookupError(f"envFrom {source} is not emulated")
            data = self.secrets.get((ns, ref["name"]))
            if data is None:
                if ref.get("optional"):
                    continue
                raise LookupError(f'secret "{ref["name"]}" not found')
            env.update({source.get("prefix", "") + k: v for k, v in data.items()})
        for var in c.get("env", []):  # env wins over envFrom, as in Kubernetes
            if "valueFrom" in var:
                ref = var["valueFrom"]["secretKeyRef"]
                env[var["name"]] = self.secrets[(ns, ref["name"])][ref["key"]]
            else:
                env[var["name"]] = var.get("value", "")
        return env

    def _log(self, key: tuple[str, str], line: str) -> None:
        with self.cond:
            ns_ = max(time.time_ns(), self._last_ns + 1000)
            self._last_ns = ns_
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns_ // 10**9)) + f".{ns_ % 10**9:09d}Z"
            self.logs[key].append((stamp, line))
            self.cond.notify_all()

    def _mount(self, ns: str, spec: dict[str, Any], c: dict[str, Any]) -> None:
        """The container's volumes: ``emptyDir`` directories made, claims required to exist."""
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for m in c.get("volumeMounts", []):
            v = volumes[m["name"]]
            if "emptyDir" in v:
                Path(m["mountPath"]).mkdir(parents=True, exist_ok=True)
            elif "persistentVolumeClaim" in v and (ns, v["persistentVolumeClaim"]["claimName"]) not in self.claims:
                raise LookupError(f'persistentvolumeclaim "{v["persistentVolumeClaim"]["claimName"]}" not found')

    def _launch(self, spec: dict[str, Any], c: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start the container's process: here a local subprocess with the pod's environment
        (tests/curation_dagster/ops/test_images.py runs it in the image instead)."""
        return subprocess.Popen([*c.get("command", []), *c.get("args", [])], env=env, cwd=env.get("HOME", "/"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def _run_pod(self, ns: str, name: str) -> None:
        key = (ns, name)
        with self.cond:
            pod = copy.deepcopy(self.pods[key])
        spec = pod["spec"]
        node, why = self._schedule(pod)
        if node is None:  # as kube-scheduler: Pending, no container statuses, a PodScheduled condition
            self._set(ns, name, conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                             "message": why}])
            return
        with self.cond:
            if key in self.pods:
                self.pods[key]["spec"]["nodeName"] = node
        (c,) = spec["containers"]  # dagster-k8s's pipes pod: one container
        self._set(ns, name, conditions=[{"type": "PodScheduled", "status": "True"}],
                  containerStatuses=self._container_status(c, {"waiting": {"reason": "ContainerCreating"}}))
        try:
            if c["image"] not in self.images:
                raise PermissionError(f'Failed to pull image "{c["image"]}": not found')
            env = self._env(ns, c)
            pod_sc, sc = spec.get("securityContext", {}), c.get("securityContext", {})
            uid = sc.get("runAsUser", pod_sc.get("runAsUser", IMAGE_USER))
            non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
            if non_root and uid == 0:
                raise LookupError("container has runAsNonRoot and image will run as root")
            self._mount(ns, spec, c)
        except PermissionError as exc:
            self._set(ns, name, containerStatuses=self._container_status(
                c, {"waiting": {"reason": "ErrImagePull", "message": str(exc)}}))
            return
        except LookupError as exc:
            self._set(ns, name, containerStatuses=self._container_status(
                c, {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}))
            return
        self.envs[name] = env
        proc = self._launch(spec, c, env)
        started = _now()
        with self.cond:
            self._procs[key] = proc
        self._set(ns, name, phase="Running", startTime=started, containerStatuses=self._container_status(
            c, {"running": {"startedAt": started}}, ready=True))

        def pump(stream: typing.IO[bytes]) -> None:
            for raw in iter(stream.readline, b""):
                self._log(key, raw.decode("utf-8", "replace").rstrip("\n"))

        readers = [threading.Thread(target=pump, args=(s,), daemon=True) for s in (proc.stdout, proc.stderr)]
        for r in readers:
            r.start()
        code = proc.wait()
        for r in readers:
            r.join()
        self.nodes[node].gpus_used -= sum(
            int(x.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)) for x in spec["containers"])
        self._set(ns, name, phase="Succeeded" if code == 0 else "Failed", containerStatuses=self._container_status(
            c, {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                               "startedAt": started, "finishedAt": _now()}}))

    def log_stream(self, ns: str, name: str, query: dict[str, str]) -> Iterator[str]:
        follow = query.get("follow", "").lower() == "true"
        stamps = query.get("timestamps", "").lower() == "true"
        tail = int(query["tailLines"]) if "tailLines" in query else None
        sent = 0
        with self.cond:
            lines = self.logs.get((ns, name), [])
            if tail is not None:
                sent = max(0, len(lines) - tail)
        while True:
            with self.cond:
                pod = self.pods.get((ns, name))
                lines = self.logs.get((ns, name), [])
                new = lines[sent:]
                state = pod["status"].get("containerStatuses", [{}])[0].get("state", {}) if pod else {}
                done = pod is None or "terminated" in state
                if not new and follow and not done:
                    self.cond.wait(0.5)
                    continue
            sent += len(new)
            for stamp, line in new:
                yield f"{stamp} {line}\n" if stamps else f"{line}\n"
            if not follow or done:
                with self.cond:
                    if len(self.logs.get((ns, name), [])) == sent:
                        return


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


POD = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?(/log)?$")
EVENTS = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")


def _handler(cluster: FakeCluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _json(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            cluster.requests.append(f"{method} {url.path}")
            pod, events = POD.match(url.path), EVENTS.match(url.path)
            if pod and method == "POST" and not pod.group(2):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._json(*cluster.create_pod(pod.group(1), body))
            elif pod and method == "GET" and not pod.group(2):
                selector = query.get("fieldSelector", "")
                wanted = selector.split("=")[-1] if selector.startswith("metadata.name=") else None
                if (selector and wanted is None) or "labelSelector" in query:
                    cluster.unhandled.append(f"{method} {self.path}")
                with cluster.cond:
                    items = [copy.deepcopy(p) for (ns, n), p in cluster.pods.items()
                             if ns == pod.group(1) and (wanted is None or n == wanted)]
                self._json(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"},
                                 "items": items})
            elif pod and method == "GET" and pod.group(2) and not pod.group(3):
                with cluster.cond:
                    found = copy.deepcopy(cluster.pods.get((pod.group(1), pod.group(2))))
                self._json(*((200, found) if found else (404, _status(404, "NotFound", "pod not found"))))
            elif pod and method == "DELETE" and pod.group(2):
                self._json(*cluster.delete_pod(pod.group(1), pod.group(2)))
            elif pod and method == "GET" and pod.group(3):
                self._logs(pod.group(1), pod.group(2), query)
            elif events and method == "GET":
                self._json(200, {"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": []})
            else:
                cluster.unhandled.append(f"{method} {self.path}")
                self._json(404, _status(404, "NotFound", f"{method} {url.path} is not emulated"))

        def _logs(self, ns: str, name: str, query: dict[str, str]) -> None:
            with cluster.cond:
                pod = cluster.pods.get((ns, name))
                state = pod["status"].get("containerStatuses", [{}])[0].get("state", {}) if pod else {}
            if pod is None:
                self._json(404, _status(404, "NotFound", f'pods "{name}" not found'))
                return
            if "waiting" in state or not state:
                reason = state.get("waiting", {}).get("reason", "PodInitializing")
                self._json(400, _status(400, "BadRequest", f'container "stage" in pod "{name}" is waiting to start: '
                                                           f"{reason}"))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()  # HTTP/1.0: the body ends when the connection closes
            for chunk in cluster.log_stream(ns, name, query):
                self.wfile.write(chunk.encode())
                self.wfile.flush()

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_DELETE(self) -> None:
            self._route("DELETE")

    return Handler


# --- fixtures --------------------------------------------------------------------------------

LONG = [
    "The river flows past the old mill and the children walk along its bank every morning.",
    "A small bakery on the corner sells fresh bread and the smell fills the whole street at dawn.",
    "Scientists measured the temperature of the lake for ten years and found a steady rise.",
    "The library opens at nine and closes at six, and on Sundays it stays closed all day long.",
    "Our team replaced the old pump with a new one and the water pressure is now much better.",
    "She planted tomatoes and beans in the garden and watered them twice a day during the summer.",
]
SHORT = ["Too short.", "Click here"]


def _relaxed_filters() -> dict[str, Any]:
    """Every numeric heuristic off except ``min_words=5``: the planted short documents are the
    only ones removed, whatever the other rules would say about these sentences."""
    out: dict[str, Any] = {}
    for name, f in P.FilteredDocumentsParams.model_fields.items():
        if isinstance(f.default, int | float) and not isinstance(f.default, bool) and type(None) in typing.get_args(
            f.annotation
        ):
            out[name] = None
    out["min_words"] = 5
    return out


@pytest.fixture
def crawl(tmp_path: Path) -> tuple[Path, CrawlSpec]:
    src = tmp_path / "web"
    src.mkdir()
    docs = [*LONG, *SHORT, LONG[0], "  " + LONG[1].replace(" ", "   ")]  # two exact duplicates
    lines = (json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs))
    (src / "part-0.jsonl").write_text("".join(lines))
    workdir = tmp_path / "workdir"
    spec = CrawlSpec(
        crawl="c1", sources={"web": P.RawDocumentsParams(url=str(src), text_field="text", id_field="id")},
        stages=("heuristic", "exact"), params={"filtered_documents": _relaxed_filters()},
    )
    save_spec(workdir, spec)
    return workdir, spec


CPU_NODE = Node(labels={"kubernetes.io/os": "linux"})
GPU_NODE = Node(labels={"kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true"},
                taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}], gpus=1)


@contextmanager
def running(fake: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: str
            ) -> Iterator[FakeCluster]:
    """Serve ``fake`` with the test's Secret and claim, and point the ``CURATE_K8S_*`` settings at it."""
    default = kubernetes.client.Configuration.get_default_copy()
    with fake:
        fake.secrets[(NAMESPACE, "curation-credentials")] = {"AWS_SECRET_ACCESS_KEY": SECRET_VALUE}
        fake.claims.add((NAMESPACE, "curation-workdir"))
        settings = {
            "KUBECONFIG_FILE": str(fake.kubeconfig(tmp_path / "kubeconfig.json")),
            "NAMESPACE": NAMESPACE, "CPU_IMAGE": CPU_IMAGE, "GPU_IMAGE": GPU_IMAGE, "POLL_INTERVAL_S": "0.05",
            "TMP_DIR": str(tmp_path / "pod-tmp"), "CACHE_DIR": str(tmp_path / "pod-cache"), "POD_WAIT_TIMEOUT_S": "60",
            **settings,
        }
        for k, v in settings.items():
            monkeypatch.setenv(k8s_spec.ENV_PREFIX + k, v)
        yield fake
    kubernetes.client.Configuration.set_default(default)


# The images' environment: this interpreter, and this checkout's code (what the image is built from).
IMAGE_ENV = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LANG": "C.UTF-8",
             "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    nodes = {"cpu-node": replace(CPU_NODE), "gpu-node": replace(GPU_NODE)}
    with running(FakeCluster(nodes, {CPU_IMAGE: IMAGE_ENV, GPU_IMAGE: IMAGE_ENV}), tmp_path, monkeypatch) as fake:
        yield fake


GPU = Resources(cpu=2.0, memory_gib=4.0, gpu=1, image="gpu")


def _run(workdir: Path, spec: CrawlSpec, instance: DagsterInstance, program: str, source: str | None,
         mode: str) -> Any:
    resource = CurationResource(workdir=str(workdir), mode=mode, workers=1)  # type: ignore[arg-type]
    return materialize(ASSETS, selection=[program], partition_key=partition_key(spec.crawl, source),
                       instance=instance, resources={"curation": resource}, raise_on_error=False)


def test_cpu_and_gpu_partitions_run_as_pods(
    crawl: tuple[Path, CrawlSpec], cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir, spec = crawl
    # Test-only: no program needs a GPU yet, so exact_duplicates is declared a GPU stage here.
    monkeypatch.setitem(catalog.PROGRAMS, "exact_duplicates", replace(catalog.PROGRAMS["exact_duplicates"],
                                                                        resources=GPU))
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(CRAWL, ["c1"])
    instance.add_dynamic_partitions(SOURCE, ["web"])
    assert _run(workdir, spec, instance, "raw_documents", "web", "in_process").success

    cpu = _run(workdir, spec, instance, "filtered_documents", "web", "k8s")
    assert cpu.success, cpu.all_events
    gpu = _run(workdir, spec, instance, "exact_duplicates", None, "k8s")
    assert gpu.success, gpu.all_events

    # Both pods were submitted through the API, scheduled where they belong, run and deleted.
    assert [p["metadata"]["labels"]["curation-dagster.io/program"] for p in cluster.posted] == [
        "filtered_documents", "exact_duplicates"]
    cpu_pod, gpu_pod = cluster.posted
    assert cpu_pod["spec"]["containers"][0]["image"] == CPU_IMAGE
    assert gpu_pod["spec"]["containers"][0]["image"] == GPU_IMAGE
    assert gpu_pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in cpu_pod["spec"]["containers"][0]["resources"]["limits"]
    assert cluster.pods == {}  # PipesK8sClient deletes its pod when done
    assert cluster.nodes["gpu-node"].gpus_used == 0
    for name in (p["metadata"]["name"] for p in cluster.posted):
        assert f"DELETE /api/v1/namespaces/{NAMESPACE}/pods/{name}" in cluster.requests
        assert f"GET /api/v1/namespaces/{NAMESPACE}/pods/{name}/log" in cluster.requests
    assert cluster.unhandled == []  # dagster-k8s called nothing the emulator does not serve

    # The metadata the stage reported over Pipes (pod log) is what Dagster recorded.
    def recorded(asset: str, key: str) -> Any:
        records = instance.fetch_materializations(AssetKey(asset), limit=1).records
        return records[0].asset_materialization.metadata[key].value  # type: ignore[union-attr]

    # A source x crawl partition's counts are one table (the UI plots no line through its partitions).
    counts = md_table(recorded("filtered_documents", "counts"))
    assert (counts["input"], counts["removed"], counts["kept"]) == (10, 2, 8)
    assert "| `min_words` | 2 |" in recorded("filtered_documents", "removed_per_reason")  # a table, not JSON
    assert recorded("exact_duplicates", "input") == 8
    assert recorded("exact_duplicates", "removed") == 2
    assert "| `web` | 2 |" in recorded("exact_duplicates", "removed_per_source")
    store = CurationResource(workdir=str(workdir)).store()
    task = resolve_task(store, spec, "exact_duplicates", None)
    manifest = store.read_manifest(task.output_dir)
    assert manifest is not None and recorded("exact_duplicates", "data_version") == manifest.data_version
    assert recorded("exact_duplicates", "params_key") == task.key

    # Credentials came from the Secret into the process, and appear in no manifest.
    for pod in cluster.posted:
        assert cluster.envs[pod["metadata"]["name"]]["AWS_SECRET_ACCESS_KEY"] == SECRET_VALUE
        assert SECRET_VALUE not in json.dumps(pod)

    # What was submitted is exactly what `curate k8s render` prints, up to the per-run values.
    settings = k8s_spec.K8sSettings.from_env()
    resource = CurationResource(workdir=str(workdir), mode="k8s", workers=1)
    for pod, (program, source) in zip(cluster.posted, [("filtered_documents", "web"), ("exact_duplicates", None)],
                                      strict=True):
        rendered = k8s.pod_manifest(settings, resource, program, "c1", source)
        assert _without_run_values(pod) == _without_run_values(rendered)


def test_a_crawl_on_kubernetes_is_one_run_of_the_crawl_job_with_a_pod_per_partition(
    crawl: tuple[Path, CrawlSpec], cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``k8s_definitions``' crawl job: one Dagster run, a step per program, every partition of the
    crawl a pod through ``PipesK8sClient`` (a switched-off stage's program has none: no pod), each
    recorded as its own materialization with its checks; the ledger is the one the executor alone
    writes."""
    import pyarrow as pa

    from curation_dagster.defs.definitions import k8s_definitions
    from stages.execute import execute_crawl
    from stages.store import Store

    workdir, spec = crawl
    monkeypatch.setenv("CURATE_WORKDIR", str(workdir))
    defs = k8s_definitions()
    job = defs.get_job_def("curate_run")
    resource = CurationResource(workdir=str(workdir), mode="k8s", workers=1, fan_out=4)
    instance = DagsterInstance.ephemeral()
    result = job.execute_in_process(run_config={"crawl": "c1"}, instance=instance, resources={"curation": resource},
                                    raise_on_error=False)
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    (run,) = instance.get_runs()
    partitions = [(p, s) for p in catalog.PROGRAMS for s in spec.partitions(p)]
    assert len(cluster.posted) == len(partitions) == 5  # N pods, one run: ingestion, heuristic, exact, output
    assert sorted(p["metadata"]["labels"]["curation-dagster.io/program"] for p in cluster.posted) == sorted(
        p for p, _ in partitions)
    assert cluster.pods == {} and cluster.unhandled == []
    mats = sorted((m.asset_key.to_user_string(), str(m.partition)) for m in (
        e.asset_materialization for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION))
        if m is not None)
    assert mats == sorted((p, str(partition_key("c1", s))) for p, s in partitions)
    alone = Store(str(tmp_path / "alone"))
    execute_crawl(alone, spec)

    def ledger(store: Any) -> pa.Table:
        pdir = DataRoot(store).output_dir(spec, "removal_ledger", None)
        return store.read_table(pdir, "ledger").sort_by([("doc_id", "ascending"), ("stage", "ascending")])

    mine = ledger(resource.store())
    assert mine.num_rows > 0 and mine.equals(ledger(alone))


def _without_run_values(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod.pop("apiVersion", None)
    pod.pop("kind", None)
    name = pod["metadata"]["name"]  # dagster-<run id[:18]>-<op>-<random suffix>
    pod["metadata"]["name"] = name[len("dagster-") + 19 : name.rindex("-")]
    for var in pod["spec"]["containers"][0]["env"]:
        if var["name"] in k8s.PIPES_ENV:
            var["value"] = "<per run>"
    return pod


def test_a_failing_stage_fails_the_dagster_step_with_its_error(
    crawl: tuple[Path, CrawlSpec], cluster: FakeCluster
) -> None:
    workdir, spec = crawl
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(CRAWL, ["c1"])
    instance.add_dynamic_partitions(SOURCE, ["web"])
    # raw_documents was never materialized: the stage right after it exits 1 inside its pod.
    result = _run(workdir, spec, instance, "filtered_documents", "web", "k8s")
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    text = str(failure.event_specific_data.error)  # type: ignore[union-attr]
    assert "raw_documents" in text and "materialized" in text
    assert len(cluster.posted) == 1 and cluster.pods == {}


def test_a_gpu_pod_that_never_schedules_fails_after_the_pending_bound(
    crawl: tuple[Path, CrawlSpec], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No GPU node: the pod stays Pending with no container status, which dagster-k8s alone waits
    out for 24 h. CURATE_K8S_PENDING_TIMEOUT_S bounds it: one line naming the partition and why."""
    workdir, spec = crawl
    monkeypatch.setitem(catalog.PROGRAMS, "exact_duplicates", replace(catalog.PROGRAMS["exact_duplicates"],
                                                                        resources=GPU))
    fake = FakeCluster({"cpu-node": replace(CPU_NODE)}, {CPU_IMAGE: IMAGE_ENV, GPU_IMAGE: IMAGE_ENV})
    with running(fake, tmp_path, monkeypatch, PENDING_TIMEOUT_S="1.5"):
        instance = DagsterInstance.ephemeral()
        instance.add_dynamic_partitions(CRAWL, ["c1"])
        instance.add_dynamic_partitions(SOURCE, ["web"])
        started = time.monotonic()
        result = _run(workdir, spec, instance, "exact_duplicates", None, "k8s")
        waited = time.monotonic() - started
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.event_specific_data.error.message.strip()  # type: ignore[union-attr]
    (pod,) = fake.posted
    assert message.startswith(f"dagster._core.definitions.events.Failure: exact_duplicates[c1]: GPU pod "
                              f"{pod['metadata']['name']} not started after 1.5s, unschedulable: 0/1 nodes are "
                              "available: 1 node(s) didn't match Pod's node affinity/selector. (no node with 1 free "
                              'nvidia.com/gpu matches nodeSelector {"nvidia.com/gpu.present": "true"} and tolerates '
                              "the pod); the bound is CURATE_K8S_PENDING_TIMEOUT_S"), message
    assert "\n" not in message
    assert 1.5 <= waited < 30
    assert fake.pods == {}  # the pending pod was deleted, not left to be scheduled later


def test_pending_bound_lets_started_and_failing_pods_through(cluster: FakeCluster) -> None:
    """The bound only waits for a start: a pod that runs, or whose image cannot be pulled (which
    dagster-k8s reports at once with the pod's events), returns at once."""
    api = _api(cluster)
    for name, container in (("runs", {"command": ["sleep", "5"]}), ("no-image", {"image": "nowhere/x:1"})):
        body = _pod(name, container=container)
        api.create_namespaced_pod(NAMESPACE, body)
        started = time.monotonic()
        k8s.wait_until_started(api, NAMESPACE, name, body["spec"], f"{name}[c1]", timeout_s=20, poll_s=0.05)
        assert time.monotonic() - started < 10
    assert _state(_wait(cluster, "runs", lambda p: True)).get("running") is not None
    # Scheduled, but its container cannot be created (a missing Secret): bounded too, and said so.
    body = _pod("no-secret", container={"envFrom": [{"secretRef": {"name": "missing"}}]})
    api.create_namespaced_pod(NAMESPACE, body)
    with pytest.raises(Failure) as failed:
        k8s.wait_until_started(api, NAMESPACE, "no-secret", body["spec"], "x[c1]", timeout_s=1, poll_s=0.05)
    assert failed.value.description == ('x[c1]: pod no-secret not started after 1s, container stage waiting: '
                                        'CreateContainerConfigError: secret "missing" not found; the bound is '
                                        'CURATE_K8S_PENDING_TIMEOUT_S')


# --- the emulator's own fidelity: what it refuses, as a cluster would ---------------------------


def _api(fake: FakeCluster) -> Any:
    config = kubernetes.client.Configuration()
    config.host = fake.url
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config))


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "stage", "image": CPU_IMAGE, "command": ["python", "-c", "print('hi')"]}
    container.update(spec.pop("container", {}))
    return {"metadata": {"name": name}, "spec": {"containers": [container], "restartPolicy": "Never", **spec}}


def _wait(fake: FakeCluster, name: str, until: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with fake.cond:
            pod = copy.deepcopy(fake.pods.get((NAMESPACE, name)))
        if pod is not None and until(pod):
            return pod
        time.sleep(0.02)
    raise AssertionError(f"pod {name} never reached the state; last: {pod}")


def _state(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod["status"].get("containerStatuses") or [{}]
    return statuses[0].get("state", {})


def test_emulator_schedules_gpu_pods_only_onto_tolerated_gpu_nodes(cluster: FakeCluster) -> None:
    api = _api(cluster)
    gpu = {"container": {"image": GPU_IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}}
    api.create_namespaced_pod(NAMESPACE, _pod("no-toleration", **copy.deepcopy(gpu)))
    pending = _wait(cluster, "no-toleration", lambda p: p["status"]["conditions"])
    assert pending["status"]["conditions"][0]["reason"] == "Unschedulable"
    assert pending["status"]["conditions"][0]["message"] == (  # kube-scheduler's wording
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint "
        "{nvidia.com/gpu: present}.")
    assert "containerStatuses" not in pending["status"] and pending["status"]["phase"] == "Pending"
    api.create_namespaced_pod(NAMESPACE, _pod(
        "tolerated", nodeSelector={"nvidia.com/gpu.present": "true"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], **copy.deepcopy(gpu)))
    done = _wait(cluster, "tolerated", lambda p: "terminated" in _state(p))
    assert done["spec"]["nodeName"] == "gpu-node" and _state(done)["terminated"]["exitCode"] == 0
    # (_preload_content=False: kubernetes 36 returns str(bytes) for a preloaded log.)
    assert api.read_namespaced_pod_log("tolerated", NAMESPACE, _preload_content=False).data == b"hi\n"
    plain = api.create_namespaced_pod(NAMESPACE, _pod("plain"))
    assert plain.metadata.name == "plain"
    assert _wait(cluster, "plain", lambda p: "terminated" in _state(p))["spec"]["nodeName"] == "cpu-node"


def test_emulator_refuses_what_a_cluster_refuses(cluster: FakeCluster) -> None:
    api = _api(cluster)
    with pytest.raises(kubernetes.client.ApiException) as invalid:
        api.create_namespaced_pod(NAMESPACE, _pod("typo", container={"imagePullPolcy": "Always"}))
    assert invalid.value.status == 422 and "imagePullPolcy" in invalid.value.body
    api.create_namespaced_pod(NAMESPACE, _pod("no-secret", container={
        "envFrom": [{"secretRef": {"name": "missing"}}]}))
    assert _wait(cluster, "no-secret", lambda p: _state(p).get("waiting", {}).get("reason") not in (
        None, "ContainerCreating"))["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == \
        "CreateContainerConfigError"
    api.create_namespaced_pod(NAMESPACE, _pod("root", securityContext={"runAsNonRoot": True, "runAsUser": 0}))
    assert _wait(cluster, "root", lambda p: "waiting" in _state(p) and _state(p)["waiting"]["reason"] != (
        "ContainerCreating"))["status"]["containerStatuses"][0]["state"]["waiting"]["message"].endswith("as root")
    api.create_namespaced_pod(NAMESPACE, _pod("unknown-image", container={"image": "nowhere/x:1"}))
    assert _wait(cluster, "unknown-image", lambda p: _state(p).get("waiting", {}).get("reason") == "ErrImagePull")
    assert cluster.unhandled == []
