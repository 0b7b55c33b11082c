"""The commands that prepare a crawl's inputs: ``sample`` (a small real-text corpus and its
configs) and ``train-quality`` (a fastText classifier from a crawl's survivors)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from curation_dagster.cli.common import CliError, dataroot, where_arguments


def cmd_sample(args: argparse.Namespace) -> int:
    from curation_dagster.tools.sample import SAMPLE_MODEL, build_sample, write_configs

    out = Path(args.out)
    folders = build_sample(out, max_docs_per_source=args.max_docs, copies=args.copies)
    plain, with_quality = write_configs(out, folders)
    for name, path in folders.items():
        print(f"{name}: {path}")
    print(f"config with every source: {plain}")
    print(f"the same with the classifier `curate train-quality` writes to {out / SAMPLE_MODEL}: {with_quality}")
    return 0


def cmd_train_quality(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from stages.params import QualityClassifier
    from stages.train_quality import FastTextParams, TrainError, TrainParams, provenance_path, train

    out = Path(args.out)
    name = args.name or out.stem
    try:
        QualityClassifier(name=name, kind="fasttext", path=str(out))
        params = TrainParams(
            max_docs=args.max_docs, holdout=args.holdout, seed=args.seed, threshold=args.threshold,
            balance=args.balance, threads=args.threads,
            fasttext=FastTextParams(**{f: getattr(args, f) for f in FastTextParams.model_fields
                                       if getattr(args, f) is not None}),
        )
    except ValidationError as exc:  # one line naming the bad option
        err = exc.errors()[0]
        field = "name" if err["loc"][:1] == ("name",) else str(err["loc"][-1]).replace("_", "-")
        raise CliError(f"--{field}: {err['msg']}") from exc
    root = dataroot(args)
    try:
        prov = train(root.store, root.spec(args.crawl), args.positive, args.negative, out, params, name)
    except TrainError as exc:
        raise CliError(str(exc)) from exc
    docs, m = prov["documents"], prov["heldout_metrics"]
    print(f"crawl {args.crawl}: positive {', '.join(args.positive)} ({docs['positive']['documents']} documents), "
          f"negative {', '.join(args.negative)} ({docs['negative']['documents']} documents); "
          f"trained on {docs['positive']['train']} + {docs['negative']['train']}, "
          f"held out {docs['positive']['heldout']} + {docs['negative']['heldout']}")
    print(f"held out, P(hq) >= {m['threshold']}: precision {m['precision']:.3f}, recall {m['recall']:.3f}, "
          f"F1 {m['f1']:.3f}, AUC {m['auc']:.3f}")
    print(f"model -> {out} (provenance {provenance_path(out)})")
    print(f"configure it under params.quality_scores.classifiers: {json.dumps(prov['classifier'])}")
    return 0


def add_commands(sub: Any) -> None:
    """``sample`` and ``train-quality``."""
    sa = sub.add_parser("sample", help="build a small real-text sample corpus from this Python installation")
    sa.add_argument("--out", required=True)
    sa.add_argument("--max-docs", type=int, default=1500, help="documents per source")
    sa.add_argument("--copies", type=int, default=1, help="lightly varied copies of each document (larger corpora)")
    sa.set_defaults(fn=cmd_sample)

    tq = sub.add_parser("train-quality", help="train a fastText quality classifier on a crawl's surviving documents: "
                                              "positive (reference) sources vs negative (crawl) sources")
    where_arguments(tq)
    tq.add_argument("--crawl", required=True)
    tq.add_argument("--positive", nargs="+", required=True, metavar="SOURCE", help="reference-quality sources")
    tq.add_argument("--negative", nargs="+", required=True, metavar="SOURCE", help="ordinary crawl sources")
    tq.add_argument("--out", required=True, metavar="MODEL.bin",
                    help="the model file; its provenance goes beside it as MODEL.json")
    tq.add_argument("--name", help="the classifier's name in the printed config (default: the model file's stem)")
    tq.add_argument("--threshold", type=float, default=0.5, help="keep when P(hq) >= this (held-out metrics at it)")
    tq.add_argument("--holdout", type=float, default=0.2, help="fraction of each class held out")
    tq.add_argument("--seed", type=int, default=0, help="seed of the sample, the split and fastText")
    tq.add_argument("--max-docs", type=int, default=100_000, help="documents per class at most (then balanced)")
    tq.add_argument("--no-balance", dest="balance", action="store_false",
                    help="train on every sampled document instead of cutting the larger class to the smaller's size")
    tq.add_argument("--threads", type=int, default=1,
                    help="fastText training threads; more than 1 is faster but not byte-for-byte reproducible")
    for flag, kind in (("dim", int), ("epoch", int), ("lr", float), ("word-ngrams", int), ("min-count", int),
                       ("bucket", int)):  # defaults: stages.train_quality.FastTextParams (docs/quality.md)
        tq.add_argument(f"--{flag}", type=kind, help=f"fastText {flag.replace('-', ' ')}")
    tq.set_defaults(fn=cmd_train_quality)
