"""The commands that size a crawl before it runs: ``size`` (hardware: memory, band keys, GPU-hours)
and ``lsh-curve`` (the LSH S-curve of a bands x rows setting)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from curation_dagster.cli.common import CliError, read_config
from stages.params import LSH_PRESETS
from stages.sizing import Assumptions


def cmd_lsh_curve(args: argparse.Namespace) -> int:
    from stages.params import lsh_curve, lsh_threshold

    bands, rows = LSH_PRESETS[args.preset] if args.preset else (args.bands, args.rows)
    if not bands or not rows or bands < 1 or rows < 1:
        raise CliError("give --bands B --rows R (both >= 1) or --preset NAME")
    print(f"bands={bands} rows={rows} hashes={bands * rows}  threshold (1/b)^(1/r) = {lsh_threshold(bands, rows):.4f}")
    print(f"{'s':>5}  {'P(candidate)':>12}")
    for s, p in lsh_curve(bands, rows, args.points):
        print(f"{s:5.2f}  {p:12.6f}  {'#' * round(p * 40)}")
    return 0


def cmd_size(args: argparse.Namespace) -> int:
    from curation_dagster.tools.sizing import as_json, parse_model, print_sizing, sizing

    assumptions = Assumptions(dup_rate=args.dup_rate, dup_similarity=args.dup_similarity,
                              tokens_per_char=args.tokens_per_char, gpu_tflops=args.gpu_tflops,
                              utilisation=args.utilisation)
    sized = sizing(args.docs, args.mean_chars, read_config(args.config), assumptions,
                  tuple(parse_model(m) for m in args.model))
    if args.json:
        print(json.dumps(as_json(sized), indent=1))
    else:
        print_sizing(sized)
    return 0


def add_commands(sub: Any) -> None:
    """``lsh-curve`` and ``size``."""
    lc = sub.add_parser("lsh-curve", help="print the LSH S-curve P(s) = 1 - (1 - s^r)^b and its threshold")
    lc.add_argument("--bands", type=int)
    lc.add_argument("--rows", type=int)
    lc.add_argument("--preset", choices=sorted(LSH_PRESETS), help="a named (bands, rows) setting")
    lc.add_argument("--points", type=int, default=21)
    lc.set_defaults(fn=cmd_lsh_curve)

    pl = sub.add_parser("size", help="size a crawl before reserving hardware: signatures, band keys, candidates, "
                                     "verification text, embedding FLOPs and GPU-hours, memory per stage pod")
    pl.add_argument("--docs", type=int, required=True, help="documents reaching fuzzy dedup")
    pl.add_argument("--mean-chars", type=float, required=True, help="their mean length in characters")
    pl.add_argument("--config", help="a `curate run --config` file: its MinHash, LSH and embedding parameters")
    pl.add_argument("--dup-rate", type=float, default=Assumptions.dup_rate,
                    help="assumed fraction of documents that near-duplicate another (default %(default)s)")
    pl.add_argument("--dup-similarity", type=float, default=Assumptions.dup_similarity,
                    help="assumed Jaccard of a near-duplicate to its original (default %(default)s)")
    pl.add_argument("--tokens-per-char", type=float, default=Assumptions.tokens_per_char,
                    help="assumed tokens per character (default %(default)s)")
    pl.add_argument("--gpu-tflops", type=float, default=Assumptions.gpu_tflops,
                    help="assumed sustained TFLOP/s of one GPU (default %(default)s)")
    pl.add_argument("--utilisation", type=float, default=Assumptions.utilisation,
                    help="assumed fraction of it reached (default 1/3)")
    pl.add_argument("--model", action="append", default=[], metavar="NAME=PARAMS[:TOKENS]",
                    help="another model to size (a classifier: 140M:512), repeatable")
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(fn=cmd_size)
