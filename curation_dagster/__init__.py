"""Orchestration of curation-dagster: Dagster assets, partitions, resources and the ``curate`` CLI.

    definitions.py   the code locations (local ``defs``, ``k8s_definitions``; deploy.py's)
    assets.py        one asset per stage program; checks.py its asset checks
    resources.py     the ``curation`` resource and ``resource_for(env)``, which builds it
    launchers/       how a partition runs: inprocess, pipes (subprocess), k8s (a pod)
    k8s_spec.py      pod specs and the k8s/ manifests, rendered from settings (pure)
    location.py      where the workdir is; crawls.py the crawl spec builder
    recrawl.py, runner.py, submit.py, deploy.py, cli.py   recrawls, ``curate run``, the deployment

Kernels (numba, torch, ...) and kubernetes are loaded only when a task executes; the import
graph has no cycle (tests/test_imports.py).
"""
