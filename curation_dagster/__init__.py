"""Orchestration of curation-dagster: Dagster assets, partitions, resources and the ``curate`` CLI.

Imports the stage package's catalog, spec, plan, execute, params and store (and helpers such as
``stages.dataroot``), never a program or a kernel at module level: kernels (numba, torch, ...) are
loaded only when a task executes.
"""
