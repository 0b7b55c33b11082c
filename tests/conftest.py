"""Fixtures shared by several test modules; helpers that are not fixtures live in ``tests/support/``.

Module-level imports stay light (pytest only): ``bench/gpu_check.sh`` collects the gpu-marked
tests on a machine without Dagster, Ray or moto, and every test module loads this file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.support.ops_workdir import Prepared


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
