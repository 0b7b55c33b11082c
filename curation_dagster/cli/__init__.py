"""``curate``: run a crawl through the Dagster asset graph and ask it why sources shrank.

One module per group of commands, each with its parser (``add_commands``): ``crawl`` (run,
register), ``outputs`` (report, ledger, explain, decontam-report, semantic-audit, profile),
``prepare`` (sample, train-quality), ``sizing`` (size, lsh-curve), ``deployment`` (ui, deploy,
submit, status, k8s); ``common`` what they share. The logic behind a command lives in
``curation_dagster.tools`` (no Dagster) or the role that owns it, never here.

    curate run --workdir DIR --crawl NAME --source NAME=URL [...] [--text-field F] [--id-field F] [--url-field F]
               [--stages LIST] [--config FILE]
               [--data-root URL] [--executor ray] [--ray-address ADDR] [--backend auto|cpu|gpu]
    curate register (--workdir DIR | --data-root URL) --crawl NAME --source NAME=URL [...] | --config FILE
    curate report (--workdir DIR | --data-root URL) --crawl NAME [--json]
    curate ledger (--workdir DIR | --data-root URL) --crawl NAME --out FILE.parquet
    curate explain (--workdir DIR | --data-root URL) --crawl NAME DOC_ID
    curate train-quality (--workdir DIR | --data-root URL) --crawl NAME --positive SOURCE... --negative SOURCE...
               --out MODEL.bin [--name NAME] [--threshold P] [--holdout F] [--seed N] [--max-docs N] [--no-balance]
               [--threads N] [fastText options]
    curate sample --out DIR
    curate lsh-curve --bands B --rows R
    curate profile (--workdir DIR | --data-root URL) --crawl NAME [--json]
    curate size --docs N --mean-chars C [--config FILE] [--dup-rate F] [--model NAME=PARAMS[:TOKENS]] [--json]
    curate decontam-report (--workdir DIR | --data-root URL) --crawl NAME [--json]
    curate semantic-audit (--workdir DIR | --data-root URL) --crawl NAME [--out FILE.html|FILE.md] [--per-band N]
    curate ui --workdir DIR [--port 3000]
    curate deploy --workdir DIR --data-root URL [--port 3000] [--max-concurrent-runs N] [--max-retries N]
    curate submit --dagster URL --crawl NAME (--source NAME=URL ... | --config FILE) [--stages LIST] [--wait]
    curate status --dagster URL --crawl NAME
    curate k8s render [--asset NAME] [--crawl NAME] [--source NAME] [--templates DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from curation_dagster.cli import crawl, deployment, outputs, prepare, sizing
from curation_dagster.cli.common import CliError
from curation_dagster.tools.crawls import SpecError
from curation_dagster.tools.report import NoLedger
from stages.credentials import CredentialInURL
from stages.dataroot import NoDataRoot, StalePrior, UnknownCrawl
from stages.errors import StageError
from stages.filters import FilterError

GROUPS = (crawl, outputs, prepare, sizing, deployment)


def parser() -> argparse.ArgumentParser:
    """Every command, group by group (each group's ``add_commands``)."""
    p = argparse.ArgumentParser(prog="curate", description="Curate crawled text into LLM training data.")
    sub = p.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", module="dagster")
    warnings.filterwarnings("ignore", message=".*is currently in beta.*")
    args = parser().parse_args(argv)
    # No argv: the console script's own process, one command and its exit; a command may then
    # act on the whole process (``curate run``'s gc.freeze), which a caller's would keep.
    args.own_process = argv is None
    try:
        return int(args.fn(args))
    except (CliError, StageError, UnknownCrawl, NoDataRoot, StalePrior, FilterError, CredentialInURL, SpecError,
            NoLedger) as exc:
        print(f"curate: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, KeyError) as exc:  # pydantic validation, bad names, paths
        msg = str(exc).strip().splitlines()
        print(f"curate: error: {type(exc).__name__}: {' '.join(m.strip() for m in msg[:3])}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("curate: interrupted", file=sys.stderr)
        return 130  # as a shell reports a command ended by SIGINT
    except Exception as exc:  # a bug or an error no handler names: still one line and exit 1
        if os.environ.get("CURATE_TRACEBACK") or isinstance(exc, ModuleNotFoundError):
            raise  # (a missing module: curation_dagster.console names the extra that brings it)
        line = " ".join(str(exc).split())[:500]
        print(f"curate: error: {type(exc).__name__}: {line} (unexpected: CURATE_TRACEBACK=1 prints the traceback)",
              file=sys.stderr)
        return 1

