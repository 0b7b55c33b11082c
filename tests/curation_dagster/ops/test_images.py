"""The images, built and run here: podman, no Docker engine and no registry.

``docker/build-images.sh`` (what ``make images`` runs) builds the stage (CPU) image and the
code-location image from docker/ on a Debian base made with debootstrap, offline from a
wheelhouse. Then, against an S3 server on 127.0.0.1 (moto's, reached with ``--network host``):

- one stage partition runs inside the stage image the way Kubernetes runs it: a Dagster
  materialization drives the real dagster-k8s path (``PipesK8sClient``) against the Kubernetes-API
  emulator of tests/e2e/test_k8s_pods.py, whose pod runner here starts the pod's container with podman:
  the pod's command, environment and Secret, user 10001, read-only root filesystem, no
  capabilities, no privilege escalation, the ``emptyDir`` volumes as tmpfs; the crawl spec comes
  from the S3 data root, as in a deployment with no shared volume. The committed manifest and
  its counts are read back from S3, and what the stage reported over Pipes (the container's log)
  is what Dagster recorded;
- the code-location image loads the definitions as the chart's gRPC server does (``dagster
  definitions validate -m curation_dagster.defs.definitions -a k8s_definitions``) and reads the S3 data root: the
  ``doc_id_unique`` asset check's verdict on that partition, evaluated inside the image;
- both images import every module tests/support/image_contents.py says they need, at one Python, and
  the stage image at the pinned Ray.

Skipped, with the reason, where podman cannot run (not Linux, not root, podman, runc or
debootstrap missing: ``make podman`` installs them on Debian as root).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import fsspec
import fsspec.config
import pytest
from dagster import AssetKey, DagsterInstance

from curation_dagster.defs.partitions import CRAWL, SOURCE
from curation_dagster.ops import k8s_spec
from stages import params as P
from stages.dataroot import DataRoot
from stages.resolve import resolve_task
from stages.spec import CrawlSpec
from stages.store import Store
from tests.e2e.test_k8s_pods import (
    CPU_NODE,
    LONG,
    NAMESPACE,
    SHORT,
    FakeCluster,
    _relaxed_filters,
    _run,
    running,
)
from tests.support import image_contents
from tests.support.metadata import md_table

# A cold build (base, wheelhouse, two images) takes minutes on 2 cores: above make test's 900 s
# per test only on a loaded machine, but then it is the build, not a hang.
pytestmark = [pytest.mark.images, pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[3]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# What `make images` builds, under the names K8sSettings and k8s/values.yaml use by default.
IMAGES = {"cpu": f"curation-dagster/stage-cpu:{VERSION}", "dagster": f"curation-dagster/code-location:{VERSION}"}
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "curation-dagster"
BUCKET = "curation-images"
KEY_ID, SECRET = "test-key-id", "test-secret-value"  # moto accepts any


def _podman_problem() -> str | None:
    if sys.platform != "linux":
        return "not Linux"
    if os.geteuid() != 0:
        return "not root (debootstrap and podman's storage as used here need root)"
    absent = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} not installed (`make podman` as root on Debian)"
    probe = subprocess.run(["podman", "--runtime", "runc", "info"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return f"`podman info` fails: {probe.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    problem = _podman_problem()
    if problem:
        pytest.skip(f"podman cannot build or run images here: {problem}")
    started = time.monotonic()
    build = subprocess.run([str(ROOT / "docker" / "build-images.sh")], capture_output=True, text=True,
                           env={**os.environ, "PYTHON": sys.executable, "CACHE": str(CACHE)}, timeout=1800)
    assert build.returncode == 0, build.stderr[-6000:]
    # The script's timings and sizes, in the test's output (pytest -s, or a failure report).
    print(build.stderr, f"[images] total {time.monotonic() - started:.1f} s", sep="", file=sys.stderr)
    return IMAGES


def podman(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """podman with the settings docker/build-images.sh wrote (runc, ulimits this sandbox allows)."""
    base = {"PATH": os.environ["PATH"], "CONTAINERS_CONF": str(CACHE / "containers.conf")}
    return subprocess.run(["podman", *args], capture_output=True, text=True, env={**base, **(env or {})},
                          timeout=timeout)


def pod_flags(spec: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """``podman run`` flags for what a kubelet enforces from the pod spec: user and group,
    read-only root filesystem, no capabilities, no privilege escalation, ``emptyDir`` volumes
    (here tmpfs, writable by the pod's user, at their size limit)."""
    pod_sc, sc = spec.get("securityContext", {}), container.get("securityContext", {})
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup", uid))
    flags = ["--user", f"{uid}:{gid}"] if uid is not None else []
    if sc.get("readOnlyRootFilesystem"):
        flags += ["--read-only", "--read-only-tmpfs=false"]  # no tmpfs but the pod's own volumes
    if "ALL" in sc.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", "ALL"]
    if sc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        empty = volumes[mount["name"]].get("emptyDir")
        if empty is not None:
            size = empty.get("sizeLimit", "64Mi").replace("Mi", "m").replace("Gi", "g")
            flags += ["--tmpfs", f"{mount['mountPath']}:rw,mode=1777,size={size}"]
    return flags


class PodmanCluster(FakeCluster):
    """The emulator, with its pods' containers run in their images by podman."""

    def __init__(self, images: dict[str, str], claims: dict[str, Path]) -> None:
        super().__init__({"node": replace(CPU_NODE)}, {image: {} for image in images.values()})
        self.claim_dirs = claims  # claim name -> the host directory it binds
        self.argv: list[list[str]] = []
        self.names: list[str] = []

    def _mount(self, ns: str, spec: dict[str, Any], c: dict[str, Any]) -> None:
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for m in c.get("volumeMounts", []):
            claim = volumes[m["name"]].get("persistentVolumeClaim")
            if claim is not None and claim["claimName"] not in self.claim_dirs:
                raise LookupError(f'persistentvolumeclaim "{claim["claimName"]}" not found')

    def _launch(self, spec: dict[str, Any], c: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[bytes]:
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        binds = [f"{self.claim_dirs[claim['claimName']]}:{m['mountPath']}" for m in c.get("volumeMounts", [])
                 if (claim := volumes[m["name"]].get("persistentVolumeClaim"))]
        name = f"curation-test-{len(self.names)}-{os.getpid()}"
        self.names.append(name)
        argv = ["podman", "run", "--rm", "--name", name, "--pull", "never", "--network", "host",
                *pod_flags(spec, c), *(f"--volume={b}" for b in binds),
                *(f"--env={k}" for k in env),  # values from podman's environment: none in the argv
                c["image"], *c.get("command", []), *c.get("args", [])]
        self.argv.append(argv)
        base = {"PATH": os.environ["PATH"], "CONTAINERS_CONF": str(CACHE / "containers.conf")}
        return subprocess.Popen(argv, env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for name in self.names:  # a killed `podman run` leaves its container running
            podman("rm", "--force", "--ignore", name, timeout=120)


@dataclass
class S3:
    endpoint: str
    fs: Any

    def env(self) -> dict[str, str]:
        """The Secret a deployment gives stage pods and the code location (envFrom)."""
        return {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL_S3": self.endpoint}


@pytest.fixture(scope="module")
def s3(images: dict[str, str]) -> Iterator[S3]:
    """moto's S3 server on 127.0.0.1 with one source: 10 documents (2 too short, 2 exact
    duplicates) and one line that is not JSON."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    saved = {k: dict(v) for k, v in fsspec.config.conf.items()}
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        fs = fsspec.filesystem("s3", skip_instance_cache=True, endpoint_url=endpoint, key=KEY_ID, secret=SECRET)
        fs.mkdir(BUCKET)
        docs = [*LONG, *SHORT, LONG[0], "  " + LONG[1].replace(" ", "   ")]
        lines = [json.dumps({"id": f"d{i}", "text": t}) for i, t in enumerate(docs)] + ['{"id": "broken", "te']
        fs.pipe(f"{BUCKET}/corpus/web/part-0.jsonl", ("\n".join(lines) + "\n").encode())
        yield S3(endpoint, fs)
    finally:
        server.stop()
        fsspec.config.conf.clear()
        fsspec.config.conf.update(saved)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, s3: S3) -> tuple[Path, CrawlSpec]:
    """The crawl spec, registered in the S3 data root (the only state pods share), and the code
    location's workdir (its curate.yaml, as the chart's ConfigMap would hold it), readable by the
    pods' user (10001)."""
    workdir = tmp_path_factory.mktemp("images") / "workdir"
    workdir.mkdir()
    (workdir / "curate.yaml").write_text("automation: {enabled: false}\n")
    spec = CrawlSpec(
        crawl="c1", sources={"web": P.RawDocumentsParams(url=f"s3://{BUCKET}/corpus/web/", text_field="text",
                                                          id_field="id")},
        stages=("heuristic", "exact"), params={"filtered_documents": _relaxed_filters()},
    )
    DataRoot.open(DATA_ROOT, options={"endpoint_url": s3.endpoint, "key": KEY_ID, "secret": SECRET}).register(spec)
    for path in [workdir, *workdir.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return workdir, spec


DATA_ROOT = f"s3://{BUCKET}/data"


@pytest.fixture(scope="module")
def stage_run(images: dict[str, str], s3: S3, workdir: tuple[Path, CrawlSpec], tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[Any, PodmanCluster, DagsterInstance]]:
    """raw_documents[c1|web] materialized by Dagster, in a pod of the stage image."""
    path, spec = workdir
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CURATE_DATA_ROOT", DATA_ROOT)  # the code location's setting: the resource's data root
        fake = PodmanCluster(images, {"curation-workdir": path})
        tmp = tmp_path_factory.mktemp("cluster")
        with running(fake, tmp, mp, CPU_IMAGE=images["cpu"], GPU_IMAGE=images["cpu"], TMP_DIR="/tmp",
                     CACHE_DIR="/cache", POD_WAIT_TIMEOUT_S="600", PENDING_TIMEOUT_S="120"):
            fake.secrets[(NAMESPACE, "curation-credentials")] = s3.env()
            instance = DagsterInstance.ephemeral()
            instance.add_dynamic_partitions(CRAWL, ["c1"])
            instance.add_dynamic_partitions(SOURCE, ["web"])
            started = time.monotonic()
            result = _run(path, spec, instance, "raw_documents", "web", "k8s")
            print(f"[images] raw_documents[c1|web] in the stage image: {time.monotonic() - started:.1f} s",
                  file=sys.stderr)
            yield result, fake, instance


def test_a_stage_partition_runs_in_the_stage_image_as_a_pod(
    stage_run: tuple[Any, PodmanCluster, DagsterInstance], s3: S3, workdir: tuple[Path, CrawlSpec]
) -> None:
    result, fake, instance = stage_run
    assert result.success, [str(e) for e in result.all_events if e.is_failure]
    (pod,) = fake.posted
    assert pod["spec"]["containers"][0]["image"] == IMAGES["cpu"]
    (argv,) = fake.argv
    assert {"--read-only", "--cap-drop", "no-new-privileges"} <= set(argv) and "10001:10001" in argv
    assert fake.pods == {}  # PipesK8sClient deleted the pod when the container exited

    # Committed on S3, by the process in the image: the manifest and its counts.
    _, spec = workdir
    store = Store(DATA_ROOT, {"endpoint_url": s3.endpoint, "key": KEY_ID, "secret": SECRET})
    task = resolve_task(store, spec, "raw_documents", "web")
    manifest = store.read_manifest(task.output_dir)
    assert manifest is not None, s3.fs.find(f"{BUCKET}/data")
    report = manifest.report
    assert (report["input"], report["documents"], report["quarantined"]) == (11, 10, 1)
    assert list(report["quarantine_reasons"]) == ["invalid_json"]
    assert manifest.params_key == task.key
    # ... and what the stage reported over Pipes, from inside the container, is what Dagster recorded.
    record = instance.fetch_materializations(AssetKey("raw_documents"), limit=1).records[0]
    meta = record.asset_materialization.metadata  # type: ignore[union-attr]
    counts = md_table(meta["counts"])  # a source x crawl partition's counts: one table
    assert (counts["documents"], counts["quarantined"]) == (10, 1)
    assert meta["data_version"].value == manifest.data_version and meta["params_key"].value == task.key


def test_the_code_location_image_loads_the_definitions_and_reads_the_s3_data_root(
    images: dict[str, str], s3: S3, workdir: tuple[Path, CrawlSpec], stage_run: tuple[Any, Any, Any]
) -> None:
    path, _ = workdir
    env = {**s3.env(), "CURATE_WORKDIR": str(path), "CURATE_DATA_ROOT": DATA_ROOT}
    flags = ["--rm", "--pull", "never", "--network", "host", "--user", "10001:10001", "--read-only",
             "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,mode=1777", "--cap-drop", "ALL",
             f"--volume={path}:{path}:ro", *(f"--env={k}" for k in env)]
    # What the chart's user deployment serves
    # (`dagster api grpc -m curation_dagster.defs.definitions -a k8s_definitions`).
    validate = podman("run", *flags, images["dagster"], "dagster", "definitions", "validate",
                      "-m", "curation_dagster.defs.definitions", "-a", "k8s_definitions", env=env)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    # An asset check on the partition the stage image committed: manifest and doc_ids from S3.
    script = (
        "import json; from curation_dagster.defs import checks; "
        "from curation_dagster.defs.definitions import k8s_definitions; "
        "curation = k8s_definitions().resources['curation']; "
        "kind = next(k for k in checks.CHECK_KINDS if k.name == 'doc_id_unique'); "
        "v = checks.evaluate(curation, kind, 'raw_documents', 'c1', 'web'); "
        "print(json.dumps({'root': curation.root(), 'mode': curation.mode, 'passed': v.passed, "
        "'description': v.description}))"
    )
    check = podman("run", *flags, images["dagster"], "python", "-c", script, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    out = json.loads(check.stdout.strip().splitlines()[-1])
    assert out == {"root": DATA_ROOT, "mode": "k8s", "passed": True, "description": out["description"]}
    assert "10" in out["description"], out  # the 10 ingested doc_ids were read and found unique


def test_the_images_import_what_they_need_at_one_python_and_the_pinned_ray(images: dict[str, str]) -> None:
    code = ("import importlib, json, sys; mods = sorted(sys.argv[1].split(',')); "
            "[importlib.import_module(m) for m in mods]; "
            "ray = sys.modules.get('ray'); "
            "print(json.dumps({'python': list(sys.version_info[:3]), 'ray': ray and ray.__version__, 'n': len(mods)}))")
    seen = {}
    for image, name in images.items():
        needed = image_contents.needed(image)
        run = podman("run", "--rm", "--pull", "never", "--network", "none", "--read-only", "--user", "10001:10001",
                     name, "python", "-c", code, ",".join(needed))
        assert run.returncode == 0, f"{name}: {run.stderr[-3000:]}"
        seen[image] = json.loads(run.stdout.strip().splitlines()[-1])
        assert seen[image]["n"] == len(needed)
    assert seen["cpu"]["python"] == seen["dagster"]["python"]  # one base, one Python
    assert seen["cpu"]["python"][:2] == [3, 11]
    assert seen["cpu"]["ray"] == k8s_spec.RAY_VERSION
