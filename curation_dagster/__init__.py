"""Orchestration of curation-dagster: Dagster assets, partitions, resources and the ``curate`` CLI.

Imports only ``stages.params``, ``stages.paths`` and ``stages.registry`` from the stage package;
kernels (numba, torch, ...) are loaded only when a task executes.
"""
