"""Fixtures shared by several test modules; helpers that are not fixtures live in ``tests/support/``.

Module-level imports stay light (pytest only): ``bench/gpu_check.sh`` collects the gpu-marked
tests on a machine without Dagster, Ray or moto, and every test module loads this file.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.support.ops_workdir import Prepared

# The longest units of work first, so that `make test`'s two xdist workers finish together (a long
# module picked up last would run alone at the end): the modules above 100 s in a --durations run
# on a loaded 2-core machine (test_images.py with a cold image build; test_ui.py stands for the
# `prepared` unit); the rest keep their collection order.
LONGEST_FIRST = (
    "tests/curation_dagster/ops/test_deploy.py",  # 867 s
    "tests/curation_dagster/ops/test_images.py",  # 690 s
    "tests/e2e/test_ui.py",  # 219 s, with test_checks, test_recrawl and test_lineage 321 s
    "tests/test_install.py",  # 197 s
    "tests/e2e/test_scale_out.py",  # 157 s
    "tests/e2e/test_dataroot.py",  # 128 s measured as tests/stages/test_dataroot.py, whose crawls moved here
    "tests/curation_dagster/defs/test_dagster_tools.py",  # 126 s
    "tests/curation_dagster/ops/test_k8s.py",  # 108 s
)
PREPARED = "prepared"  # the unit of the modules that use the session's `prepared` workdir


def pytest_configure(config: pytest.Config) -> None:
    """pytest's temporary folders on a tmpfs (``/dev/shm``) when it has room: Dagster's SQLite
    storage fsyncs once per event, which makes a run on a disk 2-3x slower
    (``tests/support/tiny_corpus.py::fast_tmp``). Set before the first folder is made, so that
    xdist's workers, which inherit the environment and get folders under the controller's, use it
    too; ``PYTEST_DEBUG_TEMPROOT`` or ``--basetemp`` given by the caller win."""
    if config.option.basetemp or "PYTEST_DEBUG_TEMPROOT" in os.environ or hasattr(config, "workerinput"):
        return
    shm = Path("/dev/shm")
    try:
        roomy = shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 4 << 30
    except OSError:
        roomy = False
    if roomy:
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(shm)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Units of work for ``pytest -n N --dist loadgroup``: a test module is one unit (its
    module-scoped fixtures are built once), unless its tests name an ``xdist_group``; the modules
    that use the session-scoped ``prepared`` workdir are one unit, so that it is built once, not
    once per worker. The units in ``LONGEST_FIRST`` run first. Without xdist only the order changes."""
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    with_prepared = {module(item) for item in items if "prepared" in getattr(item, "fixturenames", ())}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            name = PREPARED if module(item) in with_prepared else module(item)
            item.add_marker(pytest.mark.xdist_group(name))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(module(item), len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="module")
def s3(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Storage options (the endpoint) of a moto S3 server on 127.0.0.1 holding the module's
    ``BUCKET``, with the module's ``KEY_ID`` and ``SECRET`` in the AWS environment (modules plant
    them to look for them in logs). A module that needs more (the filesystem, a Store, a loaded
    bucket) defines its own ``s3``."""
    from tests.support.moto_s3 import moto_s3

    module = request.module
    with moto_s3(module.BUCKET, module.KEY_ID, module.SECRET) as (options, _):
        yield options


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    """The session's one workdir whose tiny crawl arrived the way a production recrawl does
    (``tests/support/ops_workdir.py``), built on first use; read-only: tests copy it to change it."""
    from tests.support.ops_workdir import prepare

    return prepare(tmp_path_factory.mktemp("recrawled"))
