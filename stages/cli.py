"""``python -m stages PROGRAM --data-root URL --crawl NAME [--source NAME ...]``: run one partition
(or several of one program, one after another: a pack of small partitions in one process).
``python -m stages serve --data-root URL --crawl NAME``: a warm worker, serving partitions of any
program of the crawl one after another, as its launcher asks on stdin (:func:`serve`).

The same entry point runs in a subprocess, a container or a Kubernetes pod. It needs nothing but
the data root: the crawl's spec is read from its registry (``stages.dataroot``); execution
tuning comes with ``--tuning`` (or from ``<workdir>/curate.yaml`` with ``--workdir``, the local
default, whose data root is also the default). When launched by Dagster through Pipes
(``DAGSTER_PIPES_CONTEXT`` set), it reports its outcome (or its error, on one line) over Pipes to
the step that launched it, which records the materialization; either way it prints one JSON line
with the output directory and whether it was cached. A long partition says
how far it is every ``progress_interval_s`` (``stages.progress``): a one-shot Pipes process (a
pod) over Pipes into the run's log, a warm worker and a process alone on stderr (a warm worker's
is the run worker's: the run's compute log).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import IO, Any, TextIO, cast

from stages.catalog import PROGRAMS
from stages.dataroot import DataRoot, NoDataRoot, UnknownCrawl
from stages.errors import StageError
from stages.execute import execute
from stages.filters import FilterError
from stages.parallel import die_with_parent
from stages.params import ExecutionParams, ExecutionTuning, workdir_tuning
from stages.spec import CrawlSpec
from stages.store import Store

# Set by a launcher whose death should end this process (a Dagster run worker running it as a
# Pipes subprocess): the pid of that launcher.
PARENT_PID_ENV = "CURATE_PARENT_PID"
SERVE = "serve"  # the word of a warm worker (``python -m stages serve``), beside the programs'
IDLE = "stages serve"  # a warm worker's process name between partitions
# A stage's own errors (a bad source, a filter, counts that do not add up): one line; anything
# else is a bug, reported with its traceback.
OWN_ERRORS = (FileNotFoundError, KeyError, ValueError, StageError)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__


def _print(program: str, source: str | None, outcome: Any) -> None:
    print(json.dumps({"program": program, "source": source, "skipped": outcome.skipped, "seconds": outcome.seconds,
                      "data_version": outcome.manifest.data_version}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stages", description=__doc__)
    parser.add_argument("program", choices=[*sorted(PROGRAMS), SERVE],
                        help=f"the program to run, or {SERVE!r}: serve partitions asked for on stdin")
    parser.add_argument("--crawl", required=True)
    parser.add_argument("--source", action="append", help="a source (repeat: several partitions, in turn)")
    parser.add_argument("--data-root", help="where the crawl's spec and the outputs are (default: "
                                            "$CURATE_DATA_ROOT, else the workdir's)")
    parser.add_argument("--workdir", help="a local workdir: its data root, and its curate.yaml's execution tuning")
    parser.add_argument("--tuning", metavar="JSON", help="execution tuning (the execution: section of curate.yaml)")
    parser.add_argument("--batch-rows", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=0, help="0 = every core")
    parser.add_argument("--executor", choices=["local", "ray"], default="local", help="where fanned-out work runs")
    parser.add_argument("--ray-address", help="an existing Ray cluster (ray://head:10001, auto); default: local")
    parser.add_argument("--backend", choices=["auto", "cpu", "gpu"], default="auto",
                        help="kernels: the CPU reference, the GPU twins (bit-identical integer outputs), or auto = "
                             "gpu when torch sees a CUDA device (docs/gpu.md)")
    parser.add_argument("--force", action="store_true", help="recompute even if up to date")
    args = parser.parse_args(argv)
    if os.environ.get(PARENT_PID_ENV):
        die_with_parent(int(os.environ[PARENT_PID_ENV]))
    # Storage options (credentials, endpoint_url) come as JSON in $CURATE_STORAGE_OPTIONS, never
    # as arguments; without them s3fs reads the standard AWS environment, profile or pod identity.
    try:
        root = DataRoot.open(args.data_root, args.workdir)
        spec = root.spec(args.crawl)
        tuning = ExecutionTuning.model_validate_json(args.tuning) if args.tuning else \
            workdir_tuning(args.workdir) if args.workdir else ExecutionTuning()
    except (NoDataRoot, UnknownCrawl, ValueError, FilterError) as exc:  # unsafe names, bad tuning: ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store = root.store
    execution = tuning.apply(ExecutionParams(batch_rows=args.batch_rows, workers=args.workers,
                                             executor=args.executor, ray_address=args.ray_address,
                                             backend=args.backend))
    if args.program == SERVE:
        return serve(store, spec, execution, sys.stdin, _replies())
    sources: list[str | None] = list(args.source) if args.source else [None]
    if "DAGSTER_PIPES_CONTEXT" in os.environ:
        from dagster_pipes import open_dagster_pipes  # only the Pipes entry point needs it

        failed = False
        with open_dagster_pipes() as pipes:
            # Progress lines go to the run's log in the UI (through the Pipes message channel); each
            # partition's outcome, or its error on one line, to the step that launched this, which
            # records it.
            for source in sources:
                try:
                    outcome = execute(store, spec, args.program, source, execution, args.force, emit=pipes.log.info)
                except Exception as exc:
                    pipes.report_custom_message({"source": source, "error": _one_line(exc)})
                    if not isinstance(exc, OWN_ERRORS):  # FilterError too
                        raise  # a bug: its traceback, in the run's log
                    print(f"error: {args.program}: {exc}", file=sys.stderr)
                    failed = True
                    continue
                pipes.report_custom_message({"source": source, "skipped": outcome.skipped, "seconds": outcome.seconds,
                                             "data_version": outcome.manifest.data_version})
                _print(args.program, source, outcome)
        return 1 if failed else 0
    for source in sources:
        try:
            outcome = execute(store, spec, args.program, source, execution, args.force, emit=_stderr)
        except OWN_ERRORS as exc:  # FilterError too
            print(f"error: {args.program}: {exc}", file=sys.stderr)
            return 1
        _print(args.program, source, outcome)
    return 0


def _step_spec(spec: CrawlSpec, sent: str) -> CrawlSpec:
    """The spec a step sent with its session (JSON), which must be of the worker's crawl."""
    step = CrawlSpec.model_validate_json(sent)
    if step.crawl != spec.crawl:
        raise ValueError(f"a session of crawl {step.crawl!r} sent to a worker of crawl {spec.crawl!r}")
    return step


def _replies() -> TextIO:
    """This process's stdout, kept for the replies of :func:`serve`; fd 1 itself becomes stderr,
    so that what a library prints can never pass for a reply."""
    replies = cast(TextIO, os.fdopen(os.dup(1), "w", buffering=1))
    sys.stdout.flush()
    os.dup2(2, 1)
    return replies


def _name(title: str) -> None:
    """This process's name as ``ps -o comm`` and ``/proc/PID/comm`` show it (Linux, 15 bytes):
    a warm worker's program while it runs one of its partitions, else ``stages serve``."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_name = 15
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_name, title.encode()[:15], 0, 0, 0)


def _reply_writer(replies: TextIO) -> Any:
    """A Pipes message writer onto ``replies``, one message a line, among the replies."""
    from collections.abc import Iterator
    from contextlib import contextmanager

    from dagster_pipes import PipesMessageWriter, PipesStreamMessageWriterChannel

    class ReplyWriter(PipesMessageWriter[PipesStreamMessageWriterChannel]):
        @contextmanager
        def open(self, params: Any) -> Iterator[PipesStreamMessageWriterChannel]:
            yield PipesStreamMessageWriterChannel(replies)

    return ReplyWriter()


def serve(store: Store, spec: CrawlSpec, execution: ExecutionParams, requests: IO[str], replies: TextIO) -> int:
    """A warm worker: partitions of ``spec``'s crawl, one after another, as ``requests`` asks (one
    JSON object a line); one JSON line on ``replies`` answers each request once it is done. The
    launcher (``curation_dagster.defs.launchers.pipes.Worker``) pays this process's start and imports
    once for every partition it serves. Requests:

    - ``{"open": {DAGSTER_PIPES_CONTEXT: ..., DAGSTER_PIPES_MESSAGES: ...}, "spec": JSON}``: a
      Dagster Pipes session (a step's), the bootstrap values a Pipes subprocess finds in its
      environment, and the crawl's spec as the step read it, which the session's partitions run
      under (else the spec the worker started with); its
      messages (``opened``, log lines, ``closed``) go on ``replies`` too, one a line, where the
      launcher tells them from replies by their ``__dagster_pipes_version``; replied ``{"opened": true}``;
    - ``{"program": P, "source": S, "force": bool, "workers": n}``: run that partition with
      ``stages.execute.execute`` (its kernels on ``n`` cores, 0: the command line's; its progress
      lines to stderr, a bug's traceback to the open session's log) and reply its outcome, what a
      one-partition process reports over Pipes: ``{"done": S, "skipped", "seconds",
      "data_version"}``, or ``{"done": S, "error": one line}``. On the reply, not over Pipes:
      the launcher has it at once, not when Pipes' reader next polls its file;
    - ``{"close": true}``: close the session (its launcher then stops reading it); ``{"closed": true}``.

    While it runs a partition, the process is named after its program (``ps -o comm``, 15 bytes).
    It ends with 0 when ``requests`` ends (its launcher closed it, or died).
    """
    from stages.parallel import limit_threads

    pipes: Any = None
    _name(IDLE)

    def reply(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    for line in requests:
        request = json.loads(line)
        if "open" in request:
            from dagster_pipes import PipesContext, PipesDefaultContextLoader, PipesMappingParamsLoader

            if pipes is not None:
                pipes.close()
            # A session per step (open_dagster_pipes keeps its first context for the process); its
            # messages go on the reply stream, where the launcher reads them as they come.
            pipes = PipesContext(PipesMappingParamsLoader(request["open"]), PipesDefaultContextLoader(),
                                 _reply_writer(replies))
            if "spec" in request:  # the step's: the crawl may have been registered again since
                spec = _step_spec(spec, request["spec"])
            reply({"opened": True})
        elif "close" in request:
            if pipes is not None:
                pipes.close()
                pipes = None
            reply({"closed": True})
        else:
            program, source = request["program"], request.get("source")
            workers = int(request.get("workers") or 0)
            ran = execution.model_copy(update={"workers": workers}) if workers else execution
            limit_threads(ran.resolved_workers())
            _name(program)
            try:
                # Progress lines to stderr (the run's compute log: the UI's stdout/stderr tab), not
                # the session's log: stored as run events they cost the run worker a commit each,
                # one a partition at least, and its materialization tells as much.
                outcome = execute(store, spec, program, source, ran, bool(request.get("force")), emit=_stderr)
                message: dict[str, Any] = {"source": source, "skipped": outcome.skipped,
                                           "seconds": outcome.seconds, "data_version": outcome.manifest.data_version}
            except Exception as exc:
                message = {"source": source, "error": _one_line(exc)}
                print(f"error: {program}: {exc}", file=sys.stderr)
                if not isinstance(exc, OWN_ERRORS) and pipes is not None:  # a bug: its traceback, in the run's log
                    pipes.log.error(traceback.format_exc())
            _name(IDLE)
            reply({"done": source, **message})
    if pipes is not None:
        pipes.close()
    return 0


if __name__ == "__main__":
    from stages.parallel import exit_process

    exit_process(main())
