"""What several ``curate`` commands share: the one-line error, the data root a command reads, the
``--config`` file, and the options that make a crawl spec (``run``, ``register``, ``submit``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from curation_dagster.tools.crawls import spec_from_options
from stages.catalog import STAGES
from stages.configfile import load_mapping
from stages.dataroot import DataRoot
from stages.spec import CrawlSpec


class CliError(Exception):
    """An error reported as one line, with exit code 1."""


# The top-level keys of a ``--config`` file: what ``tools.crawls.spec_from_options`` and
# ``stages.sizing.setting_from_config`` read.
CONFIG_KEYS = ("sources", "stages", "params", "keep", "allow_damaged_files")


def read_config(path: str | None) -> dict[str, Any]:
    """The ``--config`` file (YAML, TOML or JSON by its suffix); a damaged one, or one with a
    top-level key nothing reads (a typo: ``stage:``, ``param:``), is one line naming it."""
    if not path:
        return {}
    if not Path(path).exists():
        raise CliError(f"config file {path} does not exist")
    config = load_mapping(path)
    unknown = [str(k) for k in config if k not in CONFIG_KEYS]
    if unknown:
        raise CliError(f"config file {path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(CONFIG_KEYS)}")
    return config


def dataroot(args: argparse.Namespace) -> DataRoot:
    """``--data-root`` (else ``$CURATE_DATA_ROOT``), else the data root of ``--workdir``."""
    return DataRoot.open(args.data_root, Path(args.workdir).resolve() if args.workdir else None)


def where_arguments(p: argparse.ArgumentParser) -> None:
    """The data root a command reads: given, or the workdir's (one of them, or $CURATE_DATA_ROOT)."""
    p.add_argument("--workdir", help="a local workdir: its data root (WORKDIR/data, or the one `curate run "
                                     "--data-root` recorded)")
    p.add_argument("--data-root", metavar="URL", help="the data root (a folder or fsspec URL, s3://bucket/prefix); "
                                                      "default: $CURATE_DATA_ROOT, else the workdir's")


def spec_arguments(p: argparse.ArgumentParser) -> None:
    """What makes a crawl spec (``run``, ``register`` and ``submit``)."""
    p.add_argument("--crawl", required=True)
    p.add_argument("--source", action="append", metavar="NAME=URL", help="a source of this crawl (repeat)")
    for field, default in (("text", "text"), ("id", "id; '' for none"), ("url", "url; '' for none")):
        p.add_argument(f"--{field}-field", metavar="FIELD",
                       help=f"the record field holding the {field} of the --source sources (default: {default})")
    p.add_argument("--stages", help=f"removal stages to run, comma-separated (default: all: {','.join(STAGES)})")
    p.add_argument("--config", help="YAML/JSON/TOML with sources, params per program, keep, stages")
    p.add_argument("--against", metavar="CRAWLS",
                   help="earlier crawls to dedup against, comma-separated, or 'none' (default for a new crawl: "
                        "every crawl published in the data root before it)")
    p.add_argument("--allow-damaged-files", action="store_true",
                   help="accept sources with truncated or corrupt files (their records before the damage; the "
                        "files are still reported); default: the input_complete check stops the crawl")


def spec_from_args(root: DataRoot, args: argparse.Namespace) -> CrawlSpec:
    """``run``/``register``/``submit``: the spec (``tools.crawls.spec_from_options``), its dedup
    against earlier crawls refreshed where they were rerun with new parameters since (printed:
    that re-keys this crawl's cross-crawl dedup)."""
    fields = {f: getattr(args, f) for f in ("text_field", "id_field", "url_field") if getattr(args, f) is not None}
    if fields and not args.source:
        raise CliError(f"--{next(iter(fields)).replace('_', '-')} applies to the sources given with --source")
    spec = spec_from_options(root, args.crawl, args.source or [], args.stages, read_config(args.config),
                             args.against, fields)
    if getattr(args, "allow_damaged_files", False) and not spec.allow_damaged_files:
        spec = spec.model_copy(update={"allow_damaged_files": True})
    spec, refreshed = root.refresh_priors(spec)
    for crawl in refreshed:
        print(f"crawl {spec.crawl}: deduplicated against crawl {crawl}'s current outputs now ({crawl} was rerun "
              "with new parameters): its cross-crawl dedup is recomputed", flush=True)
    return spec


def print_stale_dependents(root: DataRoot, crawl: str) -> None:
    """Name the later crawls deduplicated against ``crawl``'s outputs before its rerun."""
    later = root.stale_dependents(crawl)
    if later:
        names = ", ".join(later)
        print(f"crawl(s) {names} were deduplicated against crawl {crawl}'s earlier outputs: `curate run --crawl "
              f"NAME` dedups them against its current ones (until then their check prior_crawls_current fails)")
