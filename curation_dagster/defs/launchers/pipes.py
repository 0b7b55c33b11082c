"""Run stage partitions on warm ``python -m stages serve`` subprocesses speaking Dagster Pipes:
the stage pod's entry point and thread settings on this machine
(``CurationResource.serve_command``), so that ``curate deploy`` runs each partition as Kubernetes
would, minus the pod. A :class:`Worker` serves many partitions one after another
(``stages.cli.serve``) in a Pipes session per step (their progress lines in the run's log), each
partition's outcome replied as it finishes; its start and imports (~0.6 s) are paid once per
worker, not per partition. ``curation_dagster.run.crawl_job.Fanout`` keeps up to ``fan_out`` of
them for a run (:class:`Workers`).

Many run at once in one step (threads of ``Fanout``), each with its own Pipes session."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from dagster import (
    AssetExecutionContext,
    OpExecutionContext,
    PipesMessageReader,
    PipesSession,
    PipesTempFileContextInjector,
    PreviewWarning,
    open_pipes_session,
)

from stages.spec import CrawlSpec

# Every session reads the message reader's writer count, "preview" in dagster 1.13 (pinned): quiet
# once here (a catch_warnings per session would race between the step's launching threads).
warnings.filterwarnings("ignore", message=".*expected_writer_count.*", category=PreviewWarning)


def reported(messages: Sequence[Any], sources: Sequence[str | None], code: int | None = None
             ) -> dict[str | None, dict[str, Any]]:
    """What the process reported of each of its partitions (``stages.cli``'s custom messages: an
    outcome or an error), by source; a partition it reported nothing of gets an error (``killed``:
    by a signal, the OOM killer or an operator, so worth launching again)."""
    out: dict[str | None, dict[str, Any]] = {}
    for message in messages:
        if isinstance(message, dict) and ("error" in message or "data_version" in message):
            out[message.get("source")] = message
    for source in sources:
        if source in out:
            continue
        if code is not None and code < 0:
            out[source] = {"error": f"its process was killed by signal {-code} before it reported an outcome",
                           "killed": True}
        else:
            why = f"exited with code {code}" if code else "ended"
            out[source] = {"error": f"its process {why} without reporting an outcome"}
    return out


# Warm workers are started from this one thread, which lives as long as the process: a worker arms
# PR_SET_PDEATHSIG (``stages.cli``), which fires when the *thread* that started it ends, and a
# step's launching threads end with the step while its workers serve the next.
_STARTER = ThreadPoolExecutor(1, thread_name_prefix="stage-worker-start")


REPLY_STREAM = "reply_stream"  # the messages params of a worker's session (stages.cli.serve ignores them)


class ReplyStreamReader(PipesMessageReader):
    """The Pipes messages of a warm worker's session: on its reply stream, among its replies
    (``stages.cli.serve``), handed to the session's handler by :class:`Worker` as it reads them.
    No reader thread: ``PipesTempFileMessageReader``'s polls its file every 10 ms, one thread per
    session, which py-spy put at a third of a run worker's samples with 8 workers."""

    def __init__(self) -> None:
        self.handler: Any = None

    @contextmanager
    def read_messages(self, handler: Any) -> Iterator[dict[str, Any]]:
        self.handler = handler
        yield {REPLY_STREAM: True}

    def no_messages_debug_text(self) -> str:
        return "Attempted to read messages from the stage worker's reply stream."


class Worker:
    """A warm ``python -m stages serve`` process (``command``, with ``env`` added to this process's
    environment): requests on its stdin, one reply line each on its stdout (``stages.cli.serve``).
    One thread uses a worker at a time."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str]) -> None:
        self.proc: subprocess.Popen[str] = _STARTER.submit(
            subprocess.Popen, list(command), env={**os.environ, **env}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, bufsize=1).result()
        self.served = 0  # partitions
        self._handler: Any = None  # the open session's Pipes message handler

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _ask(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """Send one request; its reply, or None when the process ended before replying (a line cut
        short or garbled, as a killed process may leave, counts as no reply)."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(json.dumps(request) + "\n")
            stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        while line := stdout.readline():
            if not line.endswith("\n"):  # cut short: the process ended while writing it
                return None
            try:
                message = json.loads(line)
            except ValueError:
                return None
            if not isinstance(message, dict):
                return None
            if "__dagster_pipes_version" not in message:
                return dict(message)
            if self._handler is not None:  # a Pipes message of the open session: a log line, opened, closed
                self._handler.handle_message(message)
        return None

    @contextmanager
    def session(self, context: OpExecutionContext | AssetExecutionContext, spec: CrawlSpec
                ) -> Iterator[PipesSession | None]:
        """A Pipes session of ``context``'s step, opened in the worker, whose partitions it runs
        under ``spec`` (the step's: the crawl may have been registered again since the worker
        started); None when the worker ended before it opened. Closed in the worker before here,
        so no message of it is lost."""
        reader = ReplyStreamReader()
        with open_pipes_session(context=context, context_injector=PipesTempFileContextInjector(),
                                message_reader=reader) as session:
            self._handler = reader.handler
            opened = self._ask({"open": session.get_bootstrap_env_vars(),
                                "spec": spec.model_dump_json()}) is not None
            try:
                yield session if opened else None
            finally:
                if opened and self.alive():
                    self._ask({"close": True})
                self._handler = None

    def run(self, program: str, source: str | None, force: bool, workers: int) -> dict[str, Any]:
        """Run one partition in the worker (in its open session); what it replied (``skipped``,
        ``seconds``, ``data_version``, or ``error``; ``killed`` where the process died of a signal
        before it replied)."""
        self.served += 1
        reply = self._ask({"program": program, "source": source, "force": force, "workers": workers})
        if reply is None:
            self.close()
            return reported([], [source], self.proc.wait())[source]
        reply.pop("done", None)
        return reply

    def end_input(self) -> None:
        """Tell the worker to exit once it is done: its stdin closed."""
        with _quiet():
            if self.proc.stdin is not None:
                self.proc.stdin.close()

    def close(self, timeout_s: float = 10.0) -> int | None:
        """End the worker: its stdin closed (it exits), else killed after ``timeout_s``; its exit code."""
        self.end_input()
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class Workers:
    """The warm workers of one run (or one asset step): an idle one is taken before a new one is
    started (so a run has as many as its widest step ran at once); each serves one thread at a time."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str]) -> None:
        self.command, self.env = list(command), dict(env)
        self._idle: list[Worker] = []
        self._all: list[Worker] = []
        self._lock = threading.Lock()

    def take(self) -> Worker:
        """An idle live worker, else a new one."""
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                self._all.remove(worker)
        worker = Worker(self.command, self.env)
        with self._lock:
            self._all.append(worker)
        return worker

    def give(self, worker: Worker) -> None:
        """``worker`` back, idle (dropped if it died)."""
        with self._lock:
            if worker.alive():
                self._idle.append(worker)
            elif worker in self._all:
                self._all.remove(worker)

    @property
    def started(self) -> int:
        return len(self._all)

    def close(self) -> None:
        with self._lock:
            workers, self._all, self._idle = self._all, [], []
        for worker in workers:  # all told first: they exit side by side
            worker.end_input()
        for worker in workers:
            worker.close()


@contextmanager
def _quiet() -> Iterator[None]:
    try:
        yield
    except (BrokenPipeError, OSError):
        pass

