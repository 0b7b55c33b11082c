"""``curate``: run a crawl through the Dagster asset graph and ask it why sources shrank.

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
    curate plan --docs N --mean-chars C [--config FILE] [--dup-rate F] [--model NAME=PARAMS[:TOKENS]] [--json]
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
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Literal

from curation_dagster.crawls import crawl_spec
from curation_dagster.location import workdir_paths
from stages.catalog import QUARANTINE, STAGES
from stages.configfile import load_mapping
from stages.credentials import CredentialInURL
from stages.dataroot import DATA_ROOT_FILE, DataRoot, NoDataRoot, StalePrior, UnknownCrawl
from stages.errors import DamagedFile, StageError
from stages.filters import FilterError
from stages.params import LSH_PRESETS
from stages.reports import RemovalLedgerReport, read_as
from stages.sizing import Assumptions
from stages.spec import CrawlSpec
from stages.store import MANIFEST, Store

# Where `make run` trains the sample's quality classifier (under the sample folder), and the
# threshold its config keeps documents at: P(hq) >= 0.5, the training threshold.
SAMPLE_MODEL = "quality/model.bin"
SAMPLE_MIN_SCORE = 0.5


class CliError(Exception):
    """An error reported as one line, with exit code 1."""


def _read_config(path: str | None) -> dict[str, Any]:
    """The ``--config`` file (YAML, TOML or JSON by its suffix); a damaged one is one line naming it."""
    if not path:
        return {}
    if not Path(path).exists():
        raise CliError(f"config file {path} does not exist")
    return load_mapping(path)


def _spec(
    root: DataRoot, crawl: str, sources: list[str], stages: str | None, config: dict[str, Any],
    against: str | None = None, fields: dict[str, str] | None = None,
) -> CrawlSpec:
    """The crawl spec from the command line and config file (``crawls.crawl_spec`` makes it).
    With neither sources nor a config, the registered spec of the crawl is reused as it is
    (``--stages`` and ``--against`` may still change it). ``fields`` (``text_field``,
    ``id_field``, ``url_field``) apply to the ``--source`` sources."""
    saved = root.record(crawl)
    stage_list = (tuple(s.strip() for s in stages.split(",") if s.strip()) or None) if stages else None
    names = None if against is None else \
        [] if against.strip() in ("", "none") else [a.strip() for a in against.split(",") if a.strip()]
    if saved is not None and not sources and not config:
        old = saved.spec
        return crawl_spec(root, crawl, {k: v.model_dump() for k, v in old.sources.items()}, base=old,
                          stages=stage_list, against=names, allow_damaged_files=old.allow_damaged_files)
    cfg_sources: dict[str, dict[str, Any]] = dict(config.get("sources", {}))
    for item in sources:
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise CliError(f"--source expects NAME=URL, got {item!r}")
        cfg_sources[name] = {**cfg_sources.get(name, {}), "url": url, **(fields or {})}
    if not cfg_sources:
        if saved is None:
            raise CliError(f"crawl {crawl!r} is new: give its sources with --source NAME=URL")
        cfg_sources = {k: v.model_dump() for k, v in saved.spec.sources.items()}
    missing = [name for name, s in cfg_sources.items() if "url" not in s]
    if missing:
        raise CliError(f"source(s) {', '.join(missing)} have no url")
    return crawl_spec(root, crawl, cfg_sources, stages=stage_list or config.get("stages"),
                      params=config.get("params"), keep=config.get("keep"), against=names,
                      allow_damaged_files=config.get("allow_damaged_files"))


def _spec_from_args(root: DataRoot, args: argparse.Namespace) -> CrawlSpec:
    """``run``/``register``: the spec, its dedup against earlier crawls refreshed where they were
    rerun with new parameters since (printed: that re-keys this crawl's cross-crawl dedup)."""
    fields = {f: getattr(args, f) for f in ("text_field", "id_field", "url_field") if getattr(args, f) is not None}
    if fields and not args.source:
        raise CliError(f"--{next(iter(fields)).replace('_', '-')} applies to the sources given with --source")
    spec = _spec(root, args.crawl, args.source or [], args.stages, _read_config(args.config), args.against,
                      fields)
    if getattr(args, "allow_damaged_files", False) and not spec.allow_damaged_files:
        spec = spec.model_copy(update={"allow_damaged_files": True})
    spec, refreshed = root.refresh_priors(spec)
    for crawl in refreshed:
        print(f"crawl {spec.crawl}: deduplicated against crawl {crawl}'s current outputs now ({crawl} was rerun "
              "with new parameters): its cross-crawl dedup is recomputed", flush=True)
    return spec


def _stale_dependents(root: DataRoot, crawl: str) -> None:
    """Name the later crawls deduplicated against ``crawl``'s outputs before its rerun."""
    later = root.stale_dependents(crawl)
    if later:
        names = ", ".join(later)
        print(f"crawl(s) {names} were deduplicated against crawl {crawl}'s earlier outputs: `curate run --crawl "
              f"NAME` dedups them against its current ones (until then their check prior_crawls_current fails)")


def cmd_run(args: argparse.Namespace) -> int:
    from curation_dagster.config import load_config
    from curation_dagster.resources import CurationResource
    from curation_dagster.runner import RunFailed, run_crawl

    workdir, home = workdir_paths(args.workdir)
    load_config(workdir)  # a bad curate.yaml fails here in one line naming it, not inside the first Dagster run
    executor: Literal["local", "ray"] = "ray" if args.executor == "ray" or (args.ray_address and not args.executor) \
        else "local"
    resource = CurationResource(workdir=str(workdir), data_root=args.data_root, executor=executor,
                                ray_address=args.ray_address, backend=args.backend)
    root = resource.dataroot()
    spec = _spec_from_args(root, args)
    if args.data_root:  # remembered, so report/ledger/explain/ui find the outputs there
        (workdir / DATA_ROOT_FILE).write_text(args.data_root + "\n")
    if args.backend == "gpu":  # stages run in this process: fail now, not at the first GPU program
        from stages.backend import BackendUnavailable, resolve

        try:
            resolve("gpu")
        except BackendUnavailable as exc:
            raise CliError(str(exc)) from exc
    try:
        report = run_crawl(workdir, home, spec, quiet=args.quiet, force=args.force, resource=resource)
    except RunFailed as exc:  # one line, no traceback: the step's error is in the Dagster event log
        raise CliError(str(exc)) from exc
    print_report(report)
    _stale_dependents(root, spec.crawl)
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    root = _dataroot(args)
    spec = _spec_from_args(root, args)
    record = root.register(spec)
    print(f"crawl {spec.crawl} registered in {root.url} (#{record.sequence}, sources {', '.join(sorted(spec.sources))}"
          f"{'; deduplicated against ' + ', '.join(spec.dedup_against) if spec.dedup_against else ''})")
    _stale_dependents(root, spec.crawl)
    return 0


def _dataroot(args: argparse.Namespace) -> DataRoot:
    """``--data-root`` (else ``$CURATE_DATA_ROOT``), else the data root of ``--workdir``."""
    return DataRoot.open(args.data_root, Path(args.workdir).resolve() if args.workdir else None)


def _ledger_dir(root: DataRoot, crawl: str) -> tuple[Store, str, CrawlSpec]:
    spec = root.spec(crawl)
    store = root.store
    key = spec.keys()[("removal_ledger", None)]
    pdir = store.partition_dir("removal_ledger", key, crawl)
    manifest = store.read_manifest(pdir)
    if manifest is None:
        raise CliError(f"crawl {crawl!r} has no removal ledger for its current parameters; run `curate run`")
    store.check_whole(pdir, manifest)  # report, ledger and explain never show a damaged ledger
    return store, pdir, spec


def load_report(root: DataRoot, crawl: str) -> RemovalLedgerReport:
    store, pdir, _ = _ledger_dir(root, crawl)
    manifest = store.read_manifest(pdir)
    assert manifest is not None
    try:
        return read_as(manifest, RemovalLedgerReport)
    except ValueError as exc:  # a report that is not a ledger's (pydantic's ValidationError)
        raise DamagedFile(store.url(f"{pdir}/{MANIFEST}"), "removal ledger report", str(exc)) from None


def print_report(report: RemovalLedgerReport) -> None:
    from rich.console import Console
    from rich.table import Table

    from curation_dagster.lineage import EARLIER, custom_filters, earlier_crawls, step_label, step_value

    # Sub-columns (``↳``), each a part of the stage column before it: custom filters' share of the
    # heuristic removals (docs/filters.md), a dedup stage's duplicates of earlier crawls' documents.
    earlier = earlier_crawls(report)
    columns: list[str] = []
    for stage in STAGES:
        columns.append(stage)
        if stage == "heuristic":
            columns += [f"heuristic:{name}" for name in custom_filters(report)]
        if stage in earlier:
            columns.append(f"{stage}:{EARLIER}")
    table = Table(title=f"crawl {report.crawl}: what each source lost at each stage")
    for col in ["SOURCE", "INPUT", QUARANTINE.upper(), *columns, "KEPT", "KEPT %"]:
        label = step_label(report, col) if ":" in col else col.upper()
        table.add_column(label, justify="left" if col == "SOURCE" else "right", min_width=min(len(label), 24))
    totals = {"input": 0, "kept": 0, "quarantined": 0, **{c: 0 for c in columns}}
    for source, row in sorted(report.sources.items()):
        removed = [step_value(row, c) for c in columns]
        for c, n in zip(columns, removed, strict=True):
            totals[c] += n
        totals["input"] += row.input
        totals["kept"] += row.kept
        totals["quarantined"] += row.quarantined
        pct = 100.0 * row.kept / row.input if row.input else 0.0
        table.add_row(source, str(row.input), str(row.quarantined), *map(str, removed), str(row.kept), f"{pct:.1f}")
    pct = 100.0 * totals["kept"] / totals["input"] if totals["input"] else 0.0
    table.add_row("TOTAL", str(totals["input"]), str(totals["quarantined"]), *[str(totals[c]) for c in columns],
                  str(totals["kept"]), f"{pct:.1f}", style="bold")
    # Piped or logged output has no terminal width: do not squeeze the table into 80 columns.
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def _stopped(root: DataRoot, crawl: str) -> tuple[Store, CrawlSpec, Any] | None:
    """(store, spec, its committed removal lists) of a crawl that has no ledger but some removal
    list (``curation_dagster.pending``: a blocking check stopped it); None otherwise."""
    from curation_dagster.pending import pending_removals

    spec = root.spec(crawl)
    store = root.store
    if store.read_manifest(store.partition_dir("removal_ledger", spec.keys()[("removal_ledger", None)], crawl)):
        return None
    table = pending_removals(store, spec)
    return (store, spec, table) if table.num_rows else None


def cmd_report(args: argparse.Namespace) -> int:
    root = _dataroot(args)
    stopped = _stopped(root, args.crawl)
    if stopped is not None:  # the operator still sees what the stopped stage would remove; exit 1
        from curation_dagster.pending import counts, stopped_report

        _, _, table = stopped
        print(json.dumps({"crawl": args.crawl, "applied": False, "would_remove": counts(table)}, indent=1)
              if args.json else stopped_report(args.crawl, table))
        return 1
    report = load_report(root, args.crawl)
    if args.json:
        # The documented shape (README): ``removed`` here is the per-stage dict, as it always was.
        out = {"crawl": report.crawl, "sources": {
            s: {"input": r.input, "kept": r.kept, "quarantined": r.quarantined, "removed": r.removed_per_stage,
                **({"filters": r.filters} if r.filters else {}),
                **({"earlier_crawl_duplicates": r.earlier_crawl_duplicates} if r.earlier_crawl_duplicates else {})}
            for s, r in sorted(report.sources.items())
        }}
        print(json.dumps(out, indent=1))
    else:
        print_report(report)
    return 0


def cmd_ledger(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    root = _dataroot(args)
    stopped = _stopped(root, args.crawl)
    if stopped is not None:  # no ledger: the committed removal lists, marked not applied
        import pyarrow as pa

        table = stopped[2]
        table = table.append_column("applied", pa.repeat(pa.scalar(False), table.num_rows))
    else:
        store, pdir, _ = _ledger_dir(root, args.crawl)
        table = store.read_table(pdir, "ledger")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)
    if stopped is not None:
        print(f"crawl {args.crawl} has no removal ledger: {table.num_rows} row(s) its stopped stages would remove, "
              f"NOT APPLIED (column applied = false) -> {out}")
        return 1
    print(f"{table.num_rows} ledger rows -> {out}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from curation_dagster.explain import explain

    root = _dataroot(args)
    stopped = _stopped(root, args.crawl)
    if stopped is not None:
        from curation_dagster.pending import explain_pending

        pending = explain_pending(*stopped, args.doc_id)
        print(pending or f"{args.doc_id}: no committed removal list of crawl {args.crawl} names it (the crawl has "
                         "no removal ledger: it stopped before its removals were applied)")
        return 0 if pending else 1
    store, pdir, spec = _ledger_dir(root, args.crawl)
    text, found = explain(store, spec, pdir, args.doc_id)
    print(text)
    return 0 if found else 1


def cmd_sample(args: argparse.Namespace) -> int:
    from curation_dagster.sample import build_sample

    out = Path(args.out)
    folders = build_sample(out, max_docs_per_source=args.max_docs, copies=args.copies)
    config: dict[str, Any] = {"sources": {name: {"url": str(path.resolve()), "text_field": "text", "id_field": "id",
                                 "url_field": "url"} for name, path in folders.items()}}
    # A small benchmark made of lightly edited docstring passages, so the sample run shows decontam.
    from stages.decontam_sets import SAMPLE_BENCHMARK, sample_benchmark

    bench = sample_benchmark(folders["docstrings"], out / "benchmarks" / f"{SAMPLE_BENCHMARK}.jsonl")
    config["params"] = {"contaminated_documents": {"benchmarks": [
        {"name": SAMPLE_BENCHMARK, "path": str(bench.resolve())}]}}
    (out / "curate.json").write_text(json.dumps(config, indent=1))
    # The same with the quality classifier `make run` trains on a first pass's survivors
    # (`curate train-quality --positive docstrings --negative package_docs --out SAMPLE_MODEL`).
    model = out / SAMPLE_MODEL
    quality = {"classifiers": [{"name": "sample-quality", "kind": "fasttext", "path": str(model.resolve()),
                                "label": "hq", "min_score": SAMPLE_MIN_SCORE}]}
    with_quality = {**config, "params": {**config["params"], "quality_scores": quality}}
    (out / "curate-quality.json").write_text(json.dumps(with_quality, indent=1))
    for name, path in folders.items():
        print(f"{name}: {path}")
    print(f"config with every source: {out / 'curate.json'}")
    print(f"the same with the classifier `curate train-quality` writes to {model}: {out / 'curate-quality.json'}")
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
    root = _dataroot(args)
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


def cmd_decontam_report(args: argparse.Namespace) -> int:
    from curation_dagster.decontam_report import decontam_report, print_decontam_report

    root = _dataroot(args)
    report = decontam_report(root.store, root.spec(args.crawl))
    if report is None:
        raise CliError(f"crawl {args.crawl!r} has no decontam output for its current parameters; run `curate run`")
    if args.json:
        print(json.dumps(report.dump(), indent=1))
    else:
        print_decontam_report(args.crawl, report)
    return 0


def cmd_semantic_audit(args: argparse.Namespace) -> int:
    from curation_dagster.semantic_audit import AuditError, write_audit

    # The report goes beside the workdir's data by default, else into the current folder.
    folder = Path(args.workdir) if args.workdir else Path.cwd()
    out = Path(args.out) if args.out else folder / f"semantic-audit-{args.crawl}.html"
    try:
        path = write_audit(_dataroot(args), args.crawl, out, args.per_band, args.seed)
    except AuditError as exc:
        raise CliError(str(exc)) from exc
    print(f"semantic audit -> {path}")
    return 0


def cmd_lsh_curve(args: argparse.Namespace) -> int:
    from stages.params import LSH_PRESETS, lsh_curve, lsh_threshold

    bands, rows = LSH_PRESETS[args.preset] if args.preset else (args.bands, args.rows)
    if not bands or not rows or bands < 1 or rows < 1:
        raise CliError("give --bands B --rows R (both >= 1) or --preset NAME")
    print(f"bands={bands} rows={rows} hashes={bands * rows}  threshold (1/b)^(1/r) = {lsh_threshold(bands, rows):.4f}")
    print(f"{'s':>5}  {'P(candidate)':>12}")
    for s, p in lsh_curve(bands, rows, args.points):
        print(f"{s:5.2f}  {p:12.6f}  {'#' * round(p * 40)}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from curation_dagster.profile import print_profile, profile

    instance = None
    if args.workdir:  # the workdir's Dagster instance has the steps' event log (the overhead)
        from curation_dagster.instance import open_instance

        instance = open_instance(workdir_paths(args.workdir)[1])
    result = profile(_dataroot(args), args.crawl, instance)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_profile(result)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from curation_dagster.plan import as_json, parse_model, print_plan, sizing

    assumptions = Assumptions(dup_rate=args.dup_rate, dup_similarity=args.dup_similarity,
                              tokens_per_char=args.tokens_per_char, gpu_tflops=args.gpu_tflops,
                              utilisation=args.utilisation)
    plan = sizing(args.docs, args.mean_chars, _read_config(args.config), assumptions,
                  tuple(parse_model(m) for m in args.model))
    if args.json:
        print(json.dumps(as_json(plan), indent=1))
    else:
        print_plan(plan)
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    workdir, home = workdir_paths(args.workdir)
    env = {**os.environ, "DAGSTER_HOME": str(home), "CURATE_WORKDIR": str(workdir)}
    from curation_dagster.location import write_workspace

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
    from curation_dagster.deploy import DeployError, deploy

    try:
        return deploy(Path(args.workdir), args.data_root, args.port, args.max_concurrent_runs, args.max_retries)
    except DeployError as exc:
        raise CliError(str(exc)) from exc


def _deployment(args: argparse.Namespace) -> tuple[Any, DataRoot]:
    """The deployment at ``--dagster`` and its data root (``--data-root``, else the one its
    ``curation`` resource is configured with)."""
    from curation_dagster.submit import Dagster, SubmitError

    try:
        dagster = Dagster(args.dagster).connect()
        url = args.data_root or dagster.data_root()
    except SubmitError as exc:
        raise CliError(str(exc)) from exc
    return dagster, DataRoot.open(url)


def cmd_submit(args: argparse.Namespace) -> int:
    from curation_dagster.submit import SubmitError, submit, wait

    dagster, root = _deployment(args)
    spec = _spec_from_args(root, args)
    try:
        run_id = submit(dagster, root, spec, lambda m: print(m, flush=True), args.force)
        if args.wait:
            wait(dagster, root, spec, run_id, lambda m: print(m, flush=True), args.timeout)
    except SubmitError as exc:
        raise CliError(str(exc)) from exc
    if args.wait:
        print_report(load_report(root, spec.crawl))
        _stale_dependents(root, spec.crawl)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from curation_dagster.submit import SubmitError, status_table

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
    from curation_dagster.k8s_spec import write_templates
    from curation_dagster.launchers.k8s import render
    from curation_dagster.resources import resource_for

    if args.templates:
        for path in write_templates(args.templates):
            print(path)
        return 0
    # The Kubernetes code location's resource (definitions.k8s_definitions), from this environment.
    given = {"workdir": args.workdir, "data_root": args.data_root}
    curation = resource_for(os.environ, mode="k8s", **{k: v for k, v in given.items() if v})
    print(render(curation, args.asset, args.crawl, args.source), end="")
    return 0


def _spec_arguments(p: argparse.ArgumentParser) -> None:
    """What makes a crawl spec (``run`` and ``register``)."""
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


def _where(p: argparse.ArgumentParser) -> None:
    """The data root a command reads: given, or the workdir's (one of them, or $CURATE_DATA_ROOT)."""
    p.add_argument("--workdir", help="a local workdir: its data root (WORKDIR/data, or the one `curate run "
                                     "--data-root` recorded)")
    p.add_argument("--data-root", metavar="URL", help="the data root (a folder or fsspec URL, s3://bucket/prefix); "
                                                      "default: $CURATE_DATA_ROOT, else the workdir's")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="curate", description="Curate crawled text into LLM training data.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="materialize the asset graph for one crawl")
    r.add_argument("--workdir", required=True)
    _spec_arguments(r)
    r.add_argument("--force", action="store_true", help="recompute every partition")
    r.add_argument("--quiet", action="store_true", help="no progress display")
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
    _where(reg)
    _spec_arguments(reg)
    reg.set_defaults(fn=cmd_register)

    rep = sub.add_parser("report", help="the source x stage table of a crawl")
    _where(rep)
    rep.add_argument("--crawl", required=True)
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(fn=cmd_report)

    led = sub.add_parser("ledger", help="write the removal ledger of a crawl as Parquet")
    _where(led)
    led.add_argument("--crawl", required=True)
    led.add_argument("--out", required=True)
    led.set_defaults(fn=cmd_ledger)

    ex = sub.add_parser("explain", help="why a document was removed, and what it duplicated")
    _where(ex)
    ex.add_argument("--crawl", required=True)
    ex.add_argument("doc_id", help="a doc id, or a record id: every document that carries it")
    ex.set_defaults(fn=cmd_explain)

    sa = sub.add_parser("sample", help="build a small real-text sample corpus from this Python installation")
    sa.add_argument("--out", required=True)
    sa.add_argument("--max-docs", type=int, default=1500, help="documents per source")
    sa.add_argument("--copies", type=int, default=1, help="lightly varied copies of each document (larger corpora)")
    sa.set_defaults(fn=cmd_sample)

    tq = sub.add_parser("train-quality", help="train a fastText quality classifier on a crawl's surviving documents: "
                                              "positive (reference) sources vs negative (crawl) sources")
    _where(tq)
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

    dr = sub.add_parser("decontam-report", help="per benchmark: documents removed, from which sources")
    _where(dr)
    dr.add_argument("--crawl", required=True)
    dr.add_argument("--json", action="store_true")
    dr.set_defaults(fn=cmd_decontam_report)

    sm = sub.add_parser("semantic-audit", help="sampled pairs per similarity band, to choose semantic eps")
    _where(sm)
    sm.add_argument("--crawl", required=True)
    sm.add_argument("--out", help="report path, .html (default: semantic-audit-<crawl>.html in the workdir, "
                                  "else in the current folder) or .md")
    sm.add_argument("--per-band", type=int, default=4, help="pairs shown per similarity band")
    sm.add_argument("--seed", type=int, default=0, help="seed of the pair sample")
    sm.set_defaults(fn=cmd_semantic_audit)

    lc = sub.add_parser("lsh-curve", help="print the LSH S-curve P(s) = 1 - (1 - s^r)^b and its threshold")
    lc.add_argument("--bands", type=int)
    lc.add_argument("--rows", type=int)
    lc.add_argument("--preset", choices=sorted(LSH_PRESETS), help="a named (bands, rows) setting")
    lc.add_argument("--points", type=int, default=21)
    lc.set_defaults(fn=cmd_lsh_curve)

    pf = sub.add_parser("profile", help="per program and partition: documents, bytes, wall time split into read, "
                                        "compute, write and orchestration overhead")
    _where(pf)
    pf.add_argument("--crawl", required=True)
    pf.add_argument("--json", action="store_true")
    pf.set_defaults(fn=cmd_profile)

    pl = sub.add_parser("plan", help="size a crawl before reserving hardware: signatures, band keys, candidates, "
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
    pl.set_defaults(fn=cmd_plan)

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
    _spec_arguments(sb)
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

    k8s = sub.add_parser("k8s", help="Kubernetes: the pods that stage partitions run in")
    k8s_sub = k8s.add_subparsers(dest="k8s_command", required=True)
    kr = k8s_sub.add_parser("render", help="print the exact pod manifests that would be submitted, as YAML")
    kr.add_argument("--asset", help="one asset (default: every asset)")
    kr.add_argument("--workdir", help="default: $CURATE_WORKDIR, else /workdir")
    kr.add_argument("--data-root", metavar="URL", help="default: $CURATE_DATA_ROOT")
    kr.add_argument("--crawl", default="example")
    kr.add_argument("--source", default="example")
    kr.add_argument("--templates", metavar="DIR", help="write the generated k8s/ files (pod templates, RayCluster)")
    kr.set_defaults(fn=cmd_k8s_render)
    return p


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", module="dagster")
    warnings.filterwarnings("ignore", message=".*is currently in beta.*")
    args = parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except (CliError, StageError, UnknownCrawl, NoDataRoot, StalePrior, FilterError, CredentialInURL) as exc:
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


if __name__ == "__main__":
    from stages.parallel import exit_process

    exit_process(main())
