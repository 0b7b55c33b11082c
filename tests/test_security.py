"""Security: no code path unpickles or evaluates data, names cannot leave the workdir, the Dagster
UI listens on loopback only, a URL carrying a credential is refused wherever it enters and Ray
tasks get storage options without their secrets. (Credentials never reaching logs, metadata or
manifests: the planted fake AWS secret of ``test_bad_input.py``, the planted storage options of
``test_dataroot.py``, ``test_k8s.py`` and ``test_recrawl.py``.)"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from curation_dagster import cli
from curation_dagster.defs.resources import load_spec
from stages.dataroot import CRAWLS_DIR, DataRoot
from stages.execute import execute, execute_crawl
from stages.params import ExecutionParams, RawDocumentsParams
from stages.spec import CrawlSpec
from stages.store import Store, UnsafeNameError

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("stages", "curation_dagster")

BANNED_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib", "jsonpickle"}
BANNED_CALLS = {"eval", "exec", "compile", "__import__"}
BANNED_ATTRS = {("yaml", "load"), ("yaml", "unsafe_load"), ("yaml", "full_load"), ("torch", "load"),
                ("pd", "read_pickle"), ("pandas", "read_pickle")}


def product_files() -> list[Path]:
    return sorted(p for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py"))


def unsafe_calls(path: Path, root: Path = ROOT) -> list[str]:
    """Imports of serialisers that run code on load, eval/exec, and loaders that unpickle."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in BANNED_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in BANNED_MODULES:
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in BANNED_CALLS:
                found.append(f"{func.id}()")
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                    (func.value.id, func.attr) in BANNED_ATTRS:
                found.append(f"{func.value.id}.{func.attr}()")
            for kw in node.keywords:  # e.g. np.load(..., allow_pickle=True), read_csv(engine=...) stays fine
                if kw.arg in ("allow_pickle", "trust_remote_code") and not (
                        isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    found.append(f"{kw.arg}=...")
    return [f"{path.relative_to(root)}: {f}" for f in found]


def test_no_code_path_unpickles_or_evaluates_data() -> None:
    files = product_files()
    assert len(files) > 30
    assert [hit for f in files for hit in unsafe_calls(f)] == []


def test_the_scanner_finds_what_it_bans(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle\nfrom dill import loads\nimport yaml, numpy as np, torch\n"
                   "eval('1')\nexec('x = 1')\nyaml.load(s)\ntorch.load(f)\nnp.load(f, allow_pickle=True)\n"
                   "model.eval()\nyaml.safe_load(s)\nnp.load(f, allow_pickle=False)\n")
    hits = [h.split(": ", 1)[1] for h in unsafe_calls(bad, tmp_path)]
    assert hits == ["import pickle", "from dill import ...", "eval()", "exec()", "yaml.load()", "torch.load()",
                    "allow_pickle=..."]


class _Planted:
    """Pickled, a payload that creates the file ``path`` when unpickled (any code could run instead)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return open, (str(self.path), "w")


def test_pyarrow_does_not_unpickle_extension_types(tmp_path: Path) -> None:
    """CVE-2023-47248: a Parquet or IPC field may declare the ``arrow.py_extension_type`` extension,
    whose metadata pyarrow < 14.0.1 unpickled on read. A Parquet source whose text column carries a
    planted pickle: read by pyarrow, from IPC, and ingested as a source, nothing is unpickled and
    the column is its plain storage type."""
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_Planted(control)))  # the payload works: unpickled, it writes its file
    assert control.exists()
    marker = tmp_path / "unpickled"
    planted = {b"ARROW:extension:name": b"arrow.py_extension_type",
               b"ARROW:extension:metadata": pickle.dumps(_Planted(marker))}
    schema = pa.schema([pa.field("text", pa.string(), metadata=planted), pa.field("id", pa.string())])
    table = pa.table({"text": ["A planted document with a pickled extension type."], "id": ["r0"]}, schema=schema)
    source = tmp_path / "source"
    source.mkdir()
    pq.write_table(table, source / "part-0.parquet")
    assert pq.read_table(source / "part-0.parquet").schema.field("text").type == pa.string()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(table)
    assert pa.ipc.open_file(sink.getvalue()).read_all().schema.field("text").type == pa.string()
    store = Store(str(tmp_path / "data"))
    spec = CrawlSpec(crawl="c", sources={"s": {"url": str(source), "text_field": "text", "id_field": "id"}},
                     stages=("heuristic",))
    execute(store, spec, "raw_documents", "s", ExecutionParams(workers=1))
    ingested = store.read_table(DataRoot(store).output_dir(spec, "raw_documents", "s"), "documents")
    assert ingested["text"].to_pylist() == table["text"].to_pylist()
    assert not marker.exists()


# --- names and paths --------------------------------------------------------------------------------

UNSAFE = ["../x", "..", "a/b", "/etc", "a\\b", ".hidden", "x/../../y", ""]


@pytest.mark.parametrize("name", UNSAFE)
def test_unsafe_crawl_names_never_become_paths(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnsafeNameError):
        DataRoot.open(workdir=tmp_path).record_path(name)
    with pytest.raises(UnsafeNameError):
        load_spec(tmp_path, name)
    with pytest.raises(UnsafeNameError):
        Store(str(tmp_path)).partition_dir("raw_documents", "k", name)
    for argv in (["report", "--workdir", str(tmp_path / "w"), "--crawl", name],
                 ["explain", "--workdir", str(tmp_path / "w"), "--crawl", name, "0" * 32],
                 ["ledger", "--workdir", str(tmp_path / "w"), "--crawl", name, "--out", str(tmp_path / "l.parquet")],
                 ["run", "--workdir", str(tmp_path / "w"), "--crawl", name, "--source", f"s={tmp_path}"]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            assert cli.main(argv) == 1, argv
        assert "invalid crawl name" in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1, argv
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "w") == []
    assert not (tmp_path / "w" / "data" / CRAWLS_DIR).exists()


def test_the_stage_entry_point_refuses_an_unsafe_crawl_name(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "stages", "raw_documents", "--workdir", str(tmp_path / "w"),
                           "--crawl", "../../etc/passwd", "--source", "s"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "invalid crawl name" in proc.stderr and "Traceback" not in proc.stderr


def test_record_fields_never_become_paths(tmp_path: Path) -> None:
    """Record ids, URLs and texts that look like paths stay data: every file a crawl writes is
    under its data root."""
    src = tmp_path / "in"
    src.mkdir()
    recs = [{"id": "../../../escape", "url": "file:///etc/passwd", "text": "../../x " * 20},
            {"id": "/abs/path", "url": "../..", "text": "another document, with a name like a path: /tmp/x"}]
    (src / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    crawl = CrawlSpec(crawl="c1", sources={"s": RawDocumentsParams(url=str(src), id_field="id", url_field="url")},
                      stages=("heuristic", "exact"))
    before = {p for p in tmp_path.rglob("*")}
    execute_crawl(Store(str(tmp_path / "data")), crawl, ExecutionParams(workers=1))
    new = {p for p in tmp_path.rglob("*")} - before
    assert new and all(p.is_relative_to(tmp_path / "data") for p in new)


# --- the Dagster UI ------------------------------------------------------------------------------


def test_curate_ui_defaults_to_loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.parser().parse_args(["ui", "--workdir", "w"]).host == "127.0.0.1"
    seen: list[list[str]] = []

    def execvpe(file: str, args: list[str], env: dict[str, str]) -> None:
        seen.append(args)

    monkeypatch.setattr(os, "execvpe", execvpe)
    with contextlib.redirect_stdout(io.StringIO()):
        cli.main(["ui", "--workdir", str(tmp_path)])
    (args,) = seen
    assert args[args.index("-h") + 1] == "127.0.0.1"
    dagster_yaml = (tmp_path / "dagster" / "dagster.yaml").read_text()
    assert "0.0.0.0" not in dagster_yaml and "enabled: false" in dagster_yaml  # telemetry off too


LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def listening(session: int) -> set[tuple[str, int]]:
    """(hex address, port) of every TCP socket in LISTEN state held by a process of ``session``."""
    inodes = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(pid)) != session:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:  # a process that ended meanwhile
            continue
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as fh:
            for row in list(fh)[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    address, port = cols[1].split(":")
                    out.add((address, int(port, 16)))
    return out


@pytest.mark.slow  # starts `curate ui` (dagster dev: webserver, daemon, code server) for real
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux /proc")
def test_curate_ui_listens_on_loopback_only(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "ui.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "curation_dagster.cli", "ui", "--workdir", str(tmp_path / "w"),
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        while True:
            assert proc.poll() is None, (tmp_path / "ui.log").read_text()[-3000:]
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert time.monotonic() < deadline, "curate ui did not come up"
            time.sleep(0.5)
        sockets = listening(proc.pid)
        assert ("0100007F", port) in sockets
        assert {address for address, _ in sockets} <= LOOPBACK, sockets
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the UI's own session: webserver, daemon, code server
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        log.close()


def test_a_copied_workdir_keeps_its_own_event_log(tmp_path: Path) -> None:
    """The instance file names its event-log folder by absolute path; a copied workdir is pointed
    at its own folder again (an edited file is left as it is)."""
    import shutil

    from curation_dagster.ops.instance import ensure_instance_config

    home = ensure_instance_config(tmp_path / "a" / "dagster")
    assert str(home / "history") in (home / "dagster.yaml").read_text()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    copied = ensure_instance_config(tmp_path / "b" / "dagster")
    text = (copied / "dagster.yaml").read_text()
    assert str(copied / "history") in text and str(home / "history") not in text
    (copied / "dagster.yaml").write_text(text + "# mine\n")
    shutil.copytree(tmp_path / "b", tmp_path / "c")
    ensure_instance_config(tmp_path / "c" / "dagster")
    assert (tmp_path / "c" / "dagster" / "dagster.yaml").read_text() == text + "# mine\n"


# --- no secret in a URL -----------------------------------------------------------------------------

PLANTED = "Planted9SecretValue/xyz"  # never echoed, never written
CREDENTIAL_URLS = [
    f"s3://AKIAPLANTED:{PLANTED}@bucket/crawl/",  # user:password@, the secret with a '/'
    f"s3://user:{PLANTED}@bucket",
    f"https://{PLANTED.replace('/', '')}@example.org/crawl.jsonl",  # token@host
    f"https://bucket.s3.amazonaws.com/a.jsonl?X-Amz-Algorithm=AWS4&X-Amz-Credential={PLANTED}&X-Amz-Signature=ab",
    f"https://acct.blob.core.windows.net/c/a.jsonl?sv=2024&sp=r&sig={PLANTED}",
    f"https://example.org/a.jsonl?token={PLANTED}",
    f"https://example.org/a.jsonl?access_token={PLANTED}",
    f"https://example.org/a.jsonl?page=1&key={PLANTED}",
    f"gs://bucket/a.jsonl?GoogleAccessId=me&Signature={PLANTED}",
    f"simplecache::s3://AKIAPLANTED:{PLANTED}@bucket/x",
    "s3://AKIAPLANTED:/Planted9Secret+xyz@bucket/p",  # a secret that starts with '/': no host:port
    "s3://AKIAPLANTED:1234/Planted9Secret@bucket/p",  # ... or with digits, then '/'
]
PLAIN_URLS = [
    "s3://bucket/crawl/*.jsonl.gz", "abfs://container@account.dfs.core.windows.net/crawl/",
    "hf://datasets/org/name@main/data/", "http://127.0.0.1:8080/files/a@b.jsonl", "https://example.org/a.jsonl?page=2",
    "s3://bucket/a.jsonl?versionId=3", "github://org:repo@abc123/data/", "/data/user@host:x/crawl", "sftp://me@host/x",
    "s3://bucket/part-?.jsonl",
]


@pytest.mark.parametrize("url", CREDENTIAL_URLS)
def test_a_credential_in_any_url_is_refused_wherever_it_enters(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Source URLs (the params, `curate run|register --source`, curate.yaml's recrawl section),
    the data root (`--data-root`, $CURATE_DATA_ROOT, the workdir's data_root file, a Store, the
    stage entry point of pods): one check, a one-line error naming the kind, never the secret."""
    from curation_dagster.ops.config import load_config
    from stages.credentials import CredentialInURL, check_url
    from stages.dataroot import DATA_ROOT_FILE, data_root_url

    secret_parts = [PLANTED, PLANTED.replace("/", "")]

    def refused(call: Any) -> str:
        with pytest.raises(ValueError, match="carries credentials") as exc:
            call()
        assert not [s for s in secret_parts if s in str(exc.value)]
        return str(exc.value)

    refused(lambda: check_url("source URL", url))
    refused(lambda: RawDocumentsParams(url=url))
    refused(lambda: CrawlSpec.model_validate({"crawl": "c1", "sources": {"s": {"url": url}}}))
    refused(lambda: DataRoot.open(url))
    refused(lambda: Store(url))
    with pytest.raises(CredentialInURL):
        data_root_url(url)
    monkeypatch.setenv("CURATE_DATA_ROOT", url)
    refused(lambda: data_root_url(None, tmp_path))
    monkeypatch.delenv("CURATE_DATA_ROOT")
    work = tmp_path / "w"
    work.mkdir()
    (work / DATA_ROOT_FILE).write_text(url + "\n")  # e.g. edited by hand
    refused(lambda: DataRoot.open(workdir=work))
    (work / DATA_ROOT_FILE).unlink()
    for section in ({"prefix": url}, {"sources": {"news": {"url": url}}}, {"source_defaults": {"url": url}}):
        (work / "curate.yaml").write_text(json.dumps({"recrawl": section}))
        refused(lambda: load_config(work))
    (work / "curate.yaml").unlink()
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "a document"}\n')
    for argv in (["run", "--workdir", str(work), "--crawl", "c1", "--source", f"news={url}"],
                 ["register", "--workdir", str(work), "--crawl", "c1", "--source", f"news={url}"],
                 ["run", "--workdir", str(work), "--crawl", "c1", "--source", f"news={src}", "--data-root", url],
                 ["report", "--data-root", url, "--crawl", "c1"]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            assert cli.main(argv) == 1, argv
        assert "carries credentials" in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1, argv
        assert not [s for s in secret_parts if s in err.getvalue() + out.getvalue()], argv
    assert not (work / "data" / CRAWLS_DIR).exists() and not (work / DATA_ROOT_FILE).exists()


def test_the_stage_entry_point_refuses_a_data_root_with_a_credential(tmp_path: Path) -> None:
    url = CREDENTIAL_URLS[0]
    proc = subprocess.run([sys.executable, "-m", "stages", "raw_documents", "--data-root", url, "--crawl", "c1",
                           "--source", "s"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "the data root carries credentials (user:password@...)" in proc.stderr
    assert PLANTED not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.parametrize("url", PLAIN_URLS)
def test_urls_without_credentials_are_accepted(url: str) -> None:
    """adlfs's container@account, a revision after '@' in a path, github's org:repo@ref, a port,
    a version id, a local path with '@' and ':', a glob '?' are no credentials."""
    from stages.credentials import url_credential

    assert url_credential(url) is None
    assert RawDocumentsParams(url=url).url == url


def test_storage_options_reach_ray_tasks_without_their_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the driver puts in Ray's object store for its tasks holds the endpoint, never a key;
    a worker takes its credentials from its own $CURATE_STORAGE_OPTIONS (a local instance
    inherits the driver's environment; a cluster's workers have the Secret)."""
    import fsspec.config
    import numba

    from stages import parallel
    from stages.credentials import STORAGE_OPTIONS_ENV
    from stages.parallel import _worker_setup, shared_storage_conf
    from stages.store import use_storage_options

    options = {"endpoint_url": "http://127.0.0.1:9", "key": "AKIAPLANTED", "secret": PLANTED, "token": PLANTED,
               "client_kwargs": {"region_name": "eu-west-1", "aws_secret_access_key": PLANTED}}
    monkeypatch.setattr(fsspec.config, "conf", {})
    use_storage_options("s3://bucket/root", options)
    shared = shared_storage_conf(fsspec.config.conf)
    assert PLANTED not in json.dumps(shared) and "AKIAPLANTED" not in json.dumps(shared)
    assert shared["s3"] == {"endpoint_url": "http://127.0.0.1:9", "client_kwargs": {"region_name": "eu-west-1"}}
    # In a worker: the shared defaults, then the worker's own credentials over them.
    monkeypatch.setattr(fsspec.config, "conf", {})
    monkeypatch.setenv(STORAGE_OPTIONS_ENV, json.dumps({"key": "worker-key", "secret": "worker-secret"}))
    monkeypatch.setattr(parallel, "_CORES", parallel._CORES)  # it limits this process's kernels: put back after
    numba_threads = numba.get_num_threads()
    torch = sys.modules.get("torch")
    torch_threads = torch.get_num_threads() if torch is not None else None
    try:
        _worker_setup(1, shared)
    finally:
        numba.set_num_threads(numba_threads)
        if torch is not None:
            torch.set_num_threads(torch_threads)
    assert fsspec.config.conf["s3"] == {"endpoint_url": "http://127.0.0.1:9", "client_kwargs": {
        "region_name": "eu-west-1"}, "key": "worker-key", "secret": "worker-secret"}
