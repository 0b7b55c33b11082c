"""The crawl job's shape (``curation_dagster.run.crawl_job``): one static job of the code
location, a step per program in dependency order, each after the one before it, configured once
with the crawl. Running it: tests/curation_dagster/run/test_in_process.py and tests/e2e."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from curation_dagster.defs.definitions import build_definitions
from curation_dagster.defs.resources import CurationResource
from curation_dagster.run.crawl_job import CRAWL_JOB, CRAWL_JOB_DEF, STEPS, _next_step
from curation_dagster.run.crawl_job import _crawl_config as crawl_config
from stages.catalog import PROGRAMS, waves
from tests.support.tiny_corpus import spec


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


def test_the_next_step_starts_ahead_only_where_all_of_it_will_run(tmp_path: Path) -> None:
    """``_next_step``: a step that runs every partition of its program lets the next step's start
    at its own end (``PartitionPool.then_ahead``); not after a step with current partitions (one
    could be held back by its verdict), nor after the last step. The pool starts them where all
    of them will run (``begun``: none committed or begun for the crawl's keys; or a forced run)."""
    from curation_dagster.run.pool import begun
    from stages.execute import execute

    crawl = spec(stages=["heuristic", "exact", "fuzzy"])
    resource = CurationResource(workdir=str(tmp_path / "w"))
    root = resource.dataroot()
    root.register(crawl)
    sources = crawl.partitions("raw_documents")
    assert _next_step("raw_documents", sources, []) == "document_languages"
    assert _next_step("filtered_documents", sources, []) == "exact_duplicates"
    assert _next_step("raw_documents", sources[1:], sources[:1]) is None
    assert _next_step("raw_documents", [], sources) is None
    assert _next_step(STEPS[-1], [None], []) is None
    assert not begun(resource.place(), crawl, "filtered_documents")
    for source in sources:
        execute(root.store, crawl, "raw_documents", source)
    assert not begun(resource.place(), crawl, "filtered_documents")
    execute(root.store, crawl, "filtered_documents", sources[0])
    assert begun(resource.place(), crawl, "filtered_documents")  # the next run's planner decides
    assert not begun(resource.place(), crawl, "exact_duplicates")
