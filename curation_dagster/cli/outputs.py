"""The commands that read a crawl's outputs: ``report``, ``ledger``, ``explain``, ``profile``,
``decontam-report`` and ``semantic-audit``. A crawl that a blocking check stopped has no ledger:
``report``, ``ledger`` and ``explain`` then show what its committed removal lists would remove,
marked not applied, and exit 1 (``curation_dagster.tools.pending``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from curation_dagster.cli.common import CliError, dataroot, where_arguments
from curation_dagster.ops.location import workdir_paths
from curation_dagster.tools.pending import stopped
from curation_dagster.tools.report import ledger_dir, load_report, print_report, report_json


def cmd_report(args: argparse.Namespace) -> int:
    root = dataroot(args)
    halted = stopped(root, args.crawl)
    if halted is not None:  # the operator still sees what the stopped stage would remove; exit 1
        from curation_dagster.tools.pending import counts, stopped_report

        _, _, table = halted
        print(json.dumps({"crawl": args.crawl, "applied": False, "would_remove": counts(table)}, indent=1)
              if args.json else stopped_report(args.crawl, table))
        return 1
    report = load_report(root, args.crawl)
    if args.json:
        print(json.dumps(report_json(report), indent=1))
    else:
        print_report(report)
    return 0


def cmd_ledger(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    root = dataroot(args)
    halted = stopped(root, args.crawl)
    if halted is not None:  # no ledger: the committed removal lists, marked not applied
        import pyarrow as pa

        table = halted[2]
        table = table.append_column("applied", pa.repeat(pa.scalar(False), table.num_rows))
    else:
        table = root.store.read_table(ledger_dir(root, args.crawl), "ledger")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)
    if halted is not None:
        print(f"crawl {args.crawl} has no removal ledger: {table.num_rows} row(s) its stopped stages would remove, "
              f"NOT APPLIED (column applied = false) -> {out}")
        return 1
    print(f"{table.num_rows} ledger rows -> {out}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from curation_dagster.tools.explain import explain

    root = dataroot(args)
    halted = stopped(root, args.crawl)
    if halted is not None:
        from curation_dagster.tools.pending import explain_pending

        pending = explain_pending(*halted, args.doc_id)
        print(pending or f"{args.doc_id}: no committed removal list of crawl {args.crawl} names it (the crawl has "
                         "no removal ledger: it stopped before its removals were applied)")
        return 0 if pending else 1
    pdir = ledger_dir(root, args.crawl)
    text, found = explain(root.store, root.spec(args.crawl), pdir, args.doc_id)
    print(text)
    return 0 if found else 1


def cmd_decontam_report(args: argparse.Namespace) -> int:
    from curation_dagster.tools.decontam_report import decontam_report, print_decontam_report

    root = dataroot(args)
    report = decontam_report(root.store, root.spec(args.crawl))
    if report is None:
        raise CliError(f"crawl {args.crawl!r} has no decontam output for its current parameters; run `curate run`")
    if args.json:
        print(json.dumps(report.dump(), indent=1))
    else:
        print_decontam_report(args.crawl, report)
    return 0


def cmd_semantic_audit(args: argparse.Namespace) -> int:
    from curation_dagster.tools.semantic_audit import AuditError, write_audit

    # The report goes beside the workdir's data by default, else into the current folder.
    folder = Path(args.workdir) if args.workdir else Path.cwd()
    out = Path(args.out) if args.out else folder / f"semantic-audit-{args.crawl}.html"
    try:
        path = write_audit(dataroot(args), args.crawl, out, args.per_band, args.seed)
    except AuditError as exc:
        raise CliError(str(exc)) from exc
    print(f"semantic audit -> {path}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from curation_dagster.tools.profile import print_profile, profile

    overhead = None
    if args.workdir:  # the workdir's Dagster instance has the steps' event log (the overhead)
        from curation_dagster.ops.instance import open_instance
        from curation_dagster.run.recorder import recorded_overhead

        overhead = recorded_overhead(open_instance(workdir_paths(args.workdir)[1]))
    result = profile(dataroot(args), args.crawl, overhead)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_profile(result)
    return 0


def add_commands(sub: Any) -> None:
    """``report``, ``ledger``, ``explain``, ``decontam-report``, ``semantic-audit`` and ``profile``."""
    rep = sub.add_parser("report", help="the source x stage table of a crawl")
    where_arguments(rep)
    rep.add_argument("--crawl", required=True)
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(fn=cmd_report)

    led = sub.add_parser("ledger", help="write the removal ledger of a crawl as Parquet")
    where_arguments(led)
    led.add_argument("--crawl", required=True)
    led.add_argument("--out", required=True)
    led.set_defaults(fn=cmd_ledger)

    ex = sub.add_parser("explain", help="why a document was removed, and what it duplicated")
    where_arguments(ex)
    ex.add_argument("--crawl", required=True)
    ex.add_argument("doc_id", help="a doc id, or a record id: every document that carries it")
    ex.set_defaults(fn=cmd_explain)

    dr = sub.add_parser("decontam-report", help="per benchmark: documents removed, from which sources")
    where_arguments(dr)
    dr.add_argument("--crawl", required=True)
    dr.add_argument("--json", action="store_true")
    dr.set_defaults(fn=cmd_decontam_report)

    sm = sub.add_parser("semantic-audit", help="sampled pairs per similarity band, to choose semantic eps")
    where_arguments(sm)
    sm.add_argument("--crawl", required=True)
    sm.add_argument("--out", help="report path, .html (default: semantic-audit-<crawl>.html in the workdir, "
                                  "else in the current folder) or .md")
    sm.add_argument("--per-band", type=int, default=4, help="pairs shown per similarity band")
    sm.add_argument("--seed", type=int, default=0, help="seed of the pair sample")
    sm.set_defaults(fn=cmd_semantic_audit)

    pf = sub.add_parser("profile", help="per program and partition: documents, bytes, wall time split into read, "
                                        "compute, write and orchestration overhead")
    where_arguments(pf)
    pf.add_argument("--crawl", required=True)
    pf.add_argument("--json", action="store_true")
    pf.set_defaults(fn=cmd_profile)
