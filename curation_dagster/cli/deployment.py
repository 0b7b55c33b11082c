"""The commands around a Dagster deployment: ``ui`` (the workdir's), ``deploy`` (the production
shape on one machine), ``submit`` and ``status`` (a crawl on a deployment), ``k8s render``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from curation_dagster.cli.common import CliError, print_stale_dependents, spec_arguments, spec_from_args
from curation_dagster.ops.location import workdir_paths
from curation_dagster.tools.report import load_report, print_report
from stages.dataroot import DataRoot


def cmd_ui(args: argparse.Namespace) -> int:
    workdir, home = workdir_paths(args.workdir)
    env = {**os.environ, "DAGSTER_HOME": str(home), "CURATE_WORKDIR": str(workdir)}
    from curation_dagster.ops.location import write_workspace

    # The code location by its name in pyproject.toml's [tool.dagster] (what `dagster dev` in the
    # repository root loads): the name curate run's runs carry, so the UI can re-execute them.
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", str(write_workspace(home)),
           "-h", args.host, "-p", str(args.port)]
    print(f"Dagster UI on http://{args.host}:{args.port} (instance {home})", flush=True)
    # A shell starts a background job (`curate ui &` in a script) with SIGINT ignored; dagster
    # dev maps SIGTERM to the SIGINT handler, so it would ignore both and orphan its webserver,
    # daemon and code servers. Default handlers survive exec: SIGINT/SIGTERM then shut it down.
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    os.execvpe(cmd[0], cmd, env)
    return 0  # pragma: no cover


def cmd_deploy(args: argparse.Namespace) -> int:
    from curation_dagster.ops.deploy import DeployError, deploy

    try:
        return deploy(Path(args.workdir), args.data_root, args.port, args.max_concurrent_runs, args.max_retries)
    except DeployError as exc:
        raise CliError(str(exc)) from exc


def _deployment(args: argparse.Namespace) -> tuple[Any, DataRoot]:
    """The deployment at ``--dagster`` and its data root (``--data-root``, else the one its
    ``curation`` resource is configured with)."""
    from curation_dagster.ops.submit import Dagster, SubmitError

    try:
        dagster = Dagster(args.dagster).connect()
        url = args.data_root or dagster.data_root()
    except SubmitError as exc:
        raise CliError(str(exc)) from exc
    return dagster, DataRoot.open(url)


def cmd_submit(args: argparse.Namespace) -> int:
    from curation_dagster.ops.submit import SubmitError, submit, wait

    dagster, root = _deployment(args)
    spec = spec_from_args(root, args)
    try:
        run_id = submit(dagster, root, spec, lambda m: print(m, flush=True), args.force)
        if args.wait:
            wait(dagster, root, spec, run_id, lambda m: print(m, flush=True), args.timeout)
    except SubmitError as exc:
        raise CliError(str(exc)) from exc
    if args.wait:
        print_report(load_report(root, spec.crawl))
        print_stale_dependents(root, spec.crawl)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from curation_dagster.ops.submit import SubmitError, status_table

    dagster, root = _deployment(args)
    try:
        lines = status_table(dagster, root, args.crawl)
    except SubmitError as exc:
        raise CliError(str(exc)) from exc
    print("\n".join(lines))
    record = root.record(args.crawl)
    committed = record is not None and root.published(record.spec)
    print(f"removal ledger {'committed' if committed else 'not committed'} in {root.url}")
    return 0


def cmd_k8s_render(args: argparse.Namespace) -> int:
    from curation_dagster.defs.launchers.k8s import render
    from curation_dagster.defs.resources import resource_for
    from curation_dagster.ops.k8s_spec import write_templates

    if args.templates:
        for path in write_templates(args.templates):
            print(path)
        return 0
    # The Kubernetes code location's resource (definitions.k8s_definitions), from this environment.
    given = {"workdir": args.workdir, "data_root": args.data_root}
    curation = resource_for(os.environ, mode="k8s", **{k: v for k, v in given.items() if v})
    print(render(curation, args.asset, args.crawl, args.source), end="")
    return 0


def add_commands(sub: Any) -> None:
    """``ui``, ``deploy``, ``submit``, ``status`` and ``k8s render``."""
    ui = sub.add_parser("ui", help="open the Dagster UI on the workdir's instance")
    ui.add_argument("--workdir", required=True)
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(fn=cmd_ui)

    dp = sub.add_parser("deploy", help="a production-shaped Dagster deployment on this machine, in the foreground: "
                                       "PostgreSQL, daemon, webserver, code server (docs/operations.md)")
    dp.add_argument("--workdir", required=True, help="the deployment's state (DIR/deploy/) and its curate.yaml")
    dp.add_argument("--data-root", required=True, metavar="URL", help="where crawl specs and outputs live")
    dp.add_argument("--port", type=int, default=3000, help="the webserver's port on 127.0.0.1")
    dp.add_argument("--max-concurrent-runs", type=int, default=4, help="runs at once (the queue's limit)")
    dp.add_argument("--max-retries", type=int, default=2, help="retries of a run whose worker died")
    dp.set_defaults(fn=cmd_deploy)

    sb = sub.add_parser("submit", help="register a crawl in a deployment's data root and launch it there (one "
                                       "run of the crawl job, curate_run)")
    sb.add_argument("--dagster", required=True, metavar="URL", help="the deployment's webserver (http://host:port)")
    sb.add_argument("--data-root", metavar="URL", help="the deployment's data root (default: read from the "
                                                       "deployment's curation resource)")
    spec_arguments(sb)
    sb.add_argument("--force", action="store_true", help="recompute every partition")
    sb.add_argument("--wait", action="store_true", help="follow the crawl's run (and its retries); exit 0 once its "
                                                        "removal ledger is committed")
    sb.add_argument("--timeout", type=float, metavar="SECONDS", help="with --wait: give up after this long")
    sb.set_defaults(fn=cmd_submit)

    st = sub.add_parser("status", help="the newest run of a submitted crawl: per program, its partitions planned "
                                       "and recorded, and its step's state")
    st.add_argument("--dagster", required=True, metavar="URL", help="the deployment's webserver (http://host:port)")
    st.add_argument("--data-root", metavar="URL", help="the deployment's data root (default: the deployment's)")
    st.add_argument("--crawl", required=True)
    st.set_defaults(fn=cmd_status)

    k8s = sub.add_parser("k8s", help="Kubernetes: the pods that program partitions run in")
    k8s_sub = k8s.add_subparsers(dest="k8s_command", required=True)
    kr = k8s_sub.add_parser("render", help="print the exact pod manifests that would be submitted, as YAML")
    kr.add_argument("--asset", help="one asset (default: every asset)")
    kr.add_argument("--workdir", help="default: $CURATE_WORKDIR, else /workdir")
    kr.add_argument("--data-root", metavar="URL", help="default: $CURATE_DATA_ROOT")
    kr.add_argument("--crawl", default="example")
    kr.add_argument("--source", default="example")
    kr.add_argument("--templates", metavar="DIR", help="write the generated k8s/ files (pod templates, RayCluster)")
    kr.set_defaults(fn=cmd_k8s_render)
