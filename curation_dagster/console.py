"""The ``curate`` command: :func:`curation_dagster.cli.main`, or one line saying what to install.

A payload-only install (``pip install curation-dagster``: the stage programs, ``python -m
stages``) has no Dagster. ``curate``'s readers of the data root (``report``, ``ledger``,
``explain``) need none of it; the commands that drive Dagster (``run``, ``ui``, ...) say which
extra they need instead of a traceback. The CLI imports the orchestrator's libraries lazily, so
the missing module shows while a command runs, not when the CLI loads.
"""

from __future__ import annotations

import sys

# Top-level modules of the orchestrator extra (pyproject.toml).
ORCHESTRATOR = frozenset({"dagster", "dagster_webserver", "dagster_graphql", "rich", "matplotlib"})


def main(argv: list[str] | None = None) -> int:
    from curation_dagster.cli import main as cli_main

    try:
        return cli_main(argv)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in ORCHESTRATOR:
            raise
        print(f"curate: error: the orchestrator is not installed ({missing} is missing): "
              "pip install 'curation-dagster[orchestrator]'", file=sys.stderr)
        return 2
