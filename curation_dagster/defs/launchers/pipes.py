"""Run a program's partition as a ``python -m stages`` subprocess speaking Dagster Pipes: the stage
pod's command line and thread settings on this machine (``CurationResource.pod_command``), so that
``curate deploy`` runs each partition as Kubernetes would, minus the pod. Many may run at once in
one step (threads of ``curation_dagster.run.crawl_job.Fanout``): each has its own Pipes session."""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    AssetExecutionContext,
    OpExecutionContext,
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    PreviewWarning,
    open_pipes_session,
)

# Every session reads the message reader's writer count, "preview" in dagster 1.13 (pinned): quiet
# once here (a catch_warnings per session would race between the step's launching threads).
warnings.filterwarnings("ignore", message=".*expected_writer_count.*", category=PreviewWarning)


def reported(messages: Sequence[Any], sources: Sequence[str | None], code: int | None = None
             ) -> dict[str | None, dict[str, Any]]:
    """What the process reported of each of its partitions (``stages.cli``'s custom messages: an
    outcome or an error), by source; a partition it reported nothing of gets an error (``killed``:
    by a signal, the OOM killer or an operator, so worth launching again)."""
    out: dict[str | None, dict[str, Any]] = {}
    for message in messages:
        if isinstance(message, dict) and ("error" in message or "data_version" in message):
            out[message.get("source")] = message
    for source in sources:
        if source in out:
            continue
        if code is not None and code < 0:
            out[source] = {"error": f"its process was killed by signal {-code} before it reported an outcome",
                           "killed": True}
        else:
            why = f"exited with code {code}" if code else "ended"
            out[source] = {"error": f"its process {why} without reporting an outcome"}
    return out


def launch(context: OpExecutionContext | AssetExecutionContext, command: Sequence[str], env: Mapping[str, str],
           sources: Sequence[str | None]) -> dict[str | None, dict[str, Any]]:
    """Run ``command`` (the partitions of ``sources``) with ``env`` added to this process's
    environment; what it reported of each."""
    with open_pipes_session(context=context, context_injector=PipesTempFileContextInjector(),
                            message_reader=PipesTempFileMessageReader()) as session:
        proc = subprocess.Popen(list(command), env={**os.environ, **env, **session.get_bootstrap_env_vars()},
                                stdin=subprocess.DEVNULL)
        code = proc.wait()
    return reported(session.get_custom_messages(), sources, code)
