"""Orchestration of curation-dagster: the Dagster asset graph over the ``stages`` payload.

    defs/    the Dagster definitions: code locations (definitions.py), assets, asset checks,
             partitions, the ``curation`` resource, recrawls, launchers/ (pipes, k8s)
    run/     running a crawl: planner, crawl_job, pool, partition, recorder, metadata, in_process
             (``curate run``); what a warm pool's worker runs imports no Dagster (partition,
             done, judge, place, values, metadata, worker_imports)
    ops/     operating it: config, instance, event_log, location, deploy, submit, k8s_spec
    tools/   no Dagster: report, explain, lineage, profile, pending, semantic_audit, decontam_report,
             sample, sizing, crawls, examples
    cli/     ``curate``: one module per group of commands; console.py is the console script

Kernels (numba, torch, ...) and kubernetes are loaded only when a task executes; the import
graph has no cycle (tests/test_imports.py).
"""
