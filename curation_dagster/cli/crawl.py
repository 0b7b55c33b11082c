"""``curate run`` (a crawl through the crawl job, in this process) and ``curate register`` (its
spec only, for a deployment to pick up)."""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from typing import Any, Literal

from curation_dagster.cli.common import (
    CliError,
    dataroot,
    print_stale_dependents,
    spec_arguments,
    spec_from_args,
    where_arguments,
)
from curation_dagster.ops.location import workdir_paths
from curation_dagster.tools.report import print_report
from stages.dataroot import DATA_ROOT_FILE
from stages.parallel import collector_paused


def cmd_run(args: argparse.Namespace) -> int:
    from curation_dagster.run.forkserver import pooled, running, start

    # The console script started it already where the crawl is pooled (not read again here); a
    # caller in-process (``main(argv)``, ``python -m curation_dagster.cli``) starts it now, beside
    # the imports below.
    if not running() and pooled(args.config, args.source, args.executor, args.ray_address):
        start()
    from curation_dagster.ops.config import load_config
    from curation_dagster.run.place import Place
    from curation_dagster.run.pool import PartitionPool
    from stages.params import ExecutionParams, workdir_tuning

    workdir, home = workdir_paths(args.workdir)
    load_config(workdir)  # a bad curate.yaml fails here in one line naming it, not inside the first Dagster run
    executor: Literal["local", "ray"] = "ray" if args.executor == "ray" or (args.ray_address and not args.executor) \
        else "local"
    # What the ``curation`` resource resolves (checked against it: ``run_crawl``), before Dagster
    # is imported: the run's first partitions start on the pool meanwhile.
    place = Place.of(str(workdir), args.data_root, {})
    root = place.dataroot()
    spec = spec_from_args(root, args)
    if args.data_root:  # remembered, so report/ledger/explain/ui find the outputs there
        (workdir / DATA_ROOT_FILE).write_text(args.data_root + "\n")
    if args.backend == "gpu":  # stages run in this process: fail now, not at the first GPU program
        from stages.backend import BackendUnavailable, resolve

        try:
            resolve("gpu")
        except BackendUnavailable as exc:
            raise CliError(str(exc)) from exc
    root.register(spec)
    execution = workdir_tuning(workdir).apply(ExecutionParams(executor=executor, ray_address=args.ray_address,
                                                              backend=args.backend))
    with PartitionPool.ahead_of_run(place, execution, spec, args.force, fork=args.own_process) or nullcontext() as pool:
        # The modules imported here (Dagster's above all) live as long as the process. In the
        # console script's own process they leave the cyclic collector's reach, so its full
        # collections walk only what the run makes (0.33-0.41 s of this process's CPU in five
        # collections at 200 sources, 0.18-0.23 s after). Not for a caller of many runs (the
        # tests call ``cli.main``): it would keep every cycle it held, the instances' open files
        # among them.
        with collector_paused(freeze=args.own_process):
            from curation_dagster.defs.resources import CurationResource
            from curation_dagster.run.in_process import RunFailed, run_crawl

        resource = CurationResource(workdir=str(workdir), data_root=args.data_root, executor=executor,
                                    ray_address=args.ray_address, backend=args.backend)
        try:
            report = run_crawl(workdir, home, spec, quiet=args.quiet, force=args.force, resource=resource,
                               pool=pool)
        except RunFailed as exc:  # one line, no traceback: the step's error is in the Dagster event log
            raise CliError(str(exc)) from exc
    print_report(report)
    print_stale_dependents(root, spec.crawl)
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    root = dataroot(args)
    spec = spec_from_args(root, args)
    record = root.register(spec)
    print(f"crawl {spec.crawl} registered in {root.url} (#{record.sequence}, sources {', '.join(sorted(spec.sources))}"
          f"{'; deduplicated against ' + ', '.join(spec.dedup_against) if spec.dedup_against else ''})")
    print_stale_dependents(root, spec.crawl)
    return 0


def add_commands(sub: Any) -> None:
    """``run`` and ``register`` on ``sub`` (an argparse subparsers action)."""
    r = sub.add_parser("run", help="materialize the asset graph for one crawl")
    r.add_argument("--workdir", required=True)
    spec_arguments(r)
    r.add_argument("--force", action="store_true", help="recompute every partition")
    r.add_argument("--quiet", action="store_true",
                   help="no progress display and no line per partition; failures are still printed")
    r.add_argument("--data-root", metavar="URL",
                   help="where crawl specs and outputs go: a folder or fsspec URL (s3://bucket/prefix); remembered "
                        "by the workdir (default: $CURATE_DATA_ROOT, the last one given, or WORKDIR/data). Storage "
                        "options: the standard AWS environment/profile, or JSON in $CURATE_STORAGE_OPTIONS")
    r.add_argument("--executor", choices=["local", "ray"],
                   help="where fanned-out work runs: a process pool, or Ray tasks (the default with --ray-address)")
    r.add_argument("--ray-address", metavar="ADDR",
                   help="an existing Ray cluster (ray://head:10001, auto); default: Ray started on this machine")
    r.add_argument("--backend", choices=["auto", "cpu", "gpu"], default="auto",
                   help="kernels: cpu, gpu (torch twins, same answers), or auto = gpu where torch sees CUDA "
                        "(docs/gpu.md); recorded in every materialization's metadata")
    r.set_defaults(fn=cmd_run)

    reg = sub.add_parser("register", help="save a crawl's spec in the data root, without running it (a deployment "
                                          "picks it up once its partitions are added)")
    where_arguments(reg)
    spec_arguments(reg)
    reg.set_defaults(fn=cmd_register)
