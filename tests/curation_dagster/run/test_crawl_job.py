"""The crawl job's shape (``curation_dagster.run.crawl_job``): one static job of the code
location, a step per program in dependency order, each after the one before it, configured once
with the crawl. Running it: tests/curation_dagster/run/test_in_process.py and tests/e2e."""

from __future__ import annotations

from itertools import pairwise

from curation_dagster.defs.definitions import build_definitions
from curation_dagster.run.crawl_job import CRAWL_JOB, CRAWL_JOB_DEF, STEPS
from curation_dagster.run.crawl_job import _crawl_config as crawl_config
from stages.catalog import PROGRAMS, waves


def test_a_step_per_program_in_dependency_order() -> None:
    assert CRAWL_JOB_DEF.name == CRAWL_JOB == "curate_run"
    assert STEPS == [p for wave in waves() for p in wave]
    assert sorted(STEPS) == sorted(PROGRAMS)
    position = {p: i for i, p in enumerate(STEPS)}
    for program in PROGRAMS.values():  # every input is run by an earlier step
        for dep in program.deps:
            assert position[dep] < position[program.name], (dep, program.name)
    graph = CRAWL_JOB_DEF.graph
    assert sorted(node.name for node in graph.nodes) == sorted(STEPS)
    for before, after in pairwise(STEPS):  # a chain: each step waits on the one before
        upstream = graph.dependency_structure.input_to_upstream_outputs_for_node(after)
        assert [o.node_name for outs in upstream.values() for o in outs] == [before]


def test_the_crawl_is_configured_once_for_every_step() -> None:
    run_config = crawl_config.resolve_from_validated_config({"crawl": "c1", "force": True})
    assert run_config["loggers"] == {"console": {}}
    assert run_config["ops"] == {p: {"config": {"crawl": "c1", "force": True}} for p in STEPS}


def test_the_code_location_holds_the_job() -> None:
    defs = build_definitions()
    assert defs.resolve_job_def(CRAWL_JOB).name == CRAWL_JOB
