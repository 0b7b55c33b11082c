"""Run a stage partition as a ``python -m stages`` subprocess speaking Dagster Pipes: the stage
pod's command line and thread settings on this machine (``CurationResource.pod_command``), so that
``curate deploy`` runs each partition as Kubernetes would, minus the pod."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dagster import AssetExecutionContext, MaterializeResult, PipesSubprocessClient


def launch(context: AssetExecutionContext, command: Sequence[str], env: Mapping[str, str]) -> MaterializeResult:
    """Run ``command`` with ``env`` added to this process's environment; what it reported."""
    result = PipesSubprocessClient(env=dict(env)).run(context=context, command=list(command))
    return result.get_materialize_result()
