"""The ``curation`` resource: built from a code location's environment (``resource_for``), the
data root it opens, the spec it finds there, and the ``python -m stages`` command line a
subprocess or a pod runs for one partition."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from dagster import Failure

from curation_dagster.defs.resources import K8S_FAN_OUT, CurationResource, resource_for
from stages.params import RawDocumentsParams
from stages.spec import CrawlSpec


def test_resource_for_reads_the_environment_and_fields_win(tmp_path: Path) -> None:
    plain = resource_for({})
    assert (plain.workdir, plain.data_root, plain.executor, plain.mode) == (os.path.abspath("workdir"), None,
                                                                          "local", "in_process")
    assert resource_for({}, mode="k8s").workdir == "/workdir"
    env = {"CURATE_WORKDIR": str(tmp_path / "w"), "CURATE_DATA_ROOT": "s3://bucket/curation",
           "CURATE_EXECUTOR": "ray", "CURATE_RAY_ADDRESS": "ray://head:10001", "CURATE_FAN_OUT": "3",
           "CURATE_PACK_DOCUMENTS": "5000"}
    r = resource_for(env, mode="pipes", fan_out=7)
    assert (r.workdir, r.data_root, r.executor, r.ray_address, r.fan_out, r.pack_documents, r.mode) == (
        str(tmp_path / "w"), "s3://bucket/curation", "ray", "ray://head:10001", 7, 5000, "pipes")
    assert r.fan_out_now() == 7 and resource_for(env, mode="k8s").fan_out_now() == 3  # set: as set


def test_fan_out_by_default_a_warm_worker_per_core_and_eight_pods(tmp_path: Path) -> None:
    """Warm workers run beside the run worker on its machine: no more of them than its cores
    (more only share them); pods run on the cluster's CPUs, so 8 at once."""
    pipes = CurationResource(workdir=str(tmp_path), mode="pipes")
    assert pipes.fan_out == 0 and pipes.fan_out_now() == len(os.sched_getaffinity(0))
    assert CurationResource(workdir=str(tmp_path), mode="k8s").fan_out_now() == K8S_FAN_OUT == 8
    assert resource_for({"CURATE_FAN_OUT": "0"}, mode="pipes").fan_out_now() == len(os.sched_getaffinity(0))


def test_the_data_root_and_the_spec_it_holds(tmp_path: Path) -> None:
    resource = CurationResource(workdir=str(tmp_path / "w"))
    root = resource.dataroot()
    assert root.url == str(tmp_path / "w" / "data") == resource.root()
    spec = CrawlSpec(crawl="c1", sources={"web": RawDocumentsParams(url=str(tmp_path / "in"))})
    root.register(spec)
    assert resource.spec("c1") == root.spec("c1")
    with pytest.raises(Failure, match="crawl 'c9' is not registered"):
        resource.spec("c9")


def test_the_partition_command_line(tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "curate.yaml").write_text("execution:\n  text_block_bytes: 1048576\n")
    resource = CurationResource(workdir=str(workdir), data_root=str(tmp_path / "d"), batch_rows=500, workers=2,
                                backend="cpu")
    cmd = resource.command("filtered_documents", "c1", "web")
    assert cmd[:8] == ["-m", "stages", "filtered_documents", "--crawl", "c1", "--data-root", str(tmp_path / "d"),
                       "--batch-rows"]
    assert cmd[8:12] == ["500", "--workers", "2", "--tuning"]
    assert json.loads(cmd[12]) == {"text_block_bytes": 1048576}
    assert cmd[13:] == ["--backend", "cpu", "--source", "web"]
    assert resource.command("removal_ledger", "c1", None)[-2:] == ["--backend", "cpu"]
