"""The warm pool's fork server (``curation_dagster.run.pool``): a fresh process that imports the
programs once, from which each pool worker is forked with them imported.

Starting it costs the process that starts it a fork and an exec; its imports (1.5 s of CPU) run
in it, and the run's first partition waits for them. The ``curate`` console script starts it
first thing (``start_for``), before its own imports, so the two import side by side, on two
cores: started after the CLI's imports (0.45 s in), it held the run's first partition back
0.3-0.5 s at 200 sources. This module imports nothing of the project's at its top, so that the
console script reaches it at once.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.forkserver
import os
import signal
from collections.abc import Sequence
from typing import NoReturn

# What the fork server imports before it forks a worker: ``curation_dagster.run.worker_imports``,
# the executor, the programs and what any forked worker imports itself.
PRELOAD = ["curation_dagster.run.worker_imports"]


def start() -> None:
    """Start this process's fork server with ``PRELOAD``, without waiting for its imports
    (nothing where it runs already). The pool's workers adopt the environment the pool is made in
    (``curation_dagster.run.pool``), not the fork server's."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()


def stop() -> None:
    """End this process's fork server now, if it has one: at the console script's exit, the run's
    pool closed (its workers gone). A command that failed or only printed its usage before its
    pool was made would otherwise leave the server's imports holding the command's output open
    (a reader of that output waiting on them for a second or more)."""
    pid = _pid()
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:  # gone already, or not this process's child
        pass


def running() -> bool:
    """Whether this process has started its fork server (``start``)."""
    return _pid() is not None


def _pid() -> int | None:
    """The fork server's process id, None before it is started (multiprocessing's own record)."""
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)


def pooled(config: str | None, sources: Sequence[str] | None, executor: str | None, ray_address: str | None) -> bool:
    """Whether a crawl of ``curate run``'s arguments will run on the warm pool, as far as a look
    at them tells: two sources or more named (``--source``, and the ``--config`` file's), two
    cores, no Ray. A config file that cannot be read, or is no regular file (a pipe is read once:
    by the command), says no: the command tells why, in its turn."""
    from stages.parallel import usable_cores

    if executor == "ray" or ray_address or usable_cores() < 2:
        return False
    named: object = {}
    if config:
        if not os.path.isfile(config):
            return False
        from stages.configfile import load_mapping

        try:
            named = load_mapping(config).get("sources") or {}
        except Exception:
            return False
    return isinstance(named, dict | list) and len(sources or []) + len(named) >= 2


def start_for(argv: Sequence[str]) -> None:
    """Start the fork server where ``argv``, the console script's arguments, is a pooled
    ``curate run`` (``wanted``). Only a head start: where starting fails, the pool starts it, or
    says why, when it is made."""
    try:
        if wanted(argv):
            start()
    except Exception:
        pass


def wanted(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (the console script's arguments) is a ``curate run`` that will be pooled
    (``pooled``). Only the options that tell are read here, leniently, and a command that will
    not run (its usage asked for, a required option missing) says no; the CLI parses them all,
    and says what is wrong, afterwards."""
    if not argv or argv[0] != "run" or "-h" in argv or "--help" in argv:
        return False
    p = _Lenient(add_help=False, allow_abbrev=False)  # an abbreviation: the CLI's to resolve
    for option in ("--workdir", "--crawl", "--config", "--executor", "--ray-address"):
        p.add_argument(option)
    p.add_argument("--source", action="append")
    try:
        args, _ = p.parse_known_args(argv[1:])
    except ValueError:  # malformed: the CLI says so
        return False
    if not (args.workdir and args.crawl):  # required: the command stops at its usage
        return False
    return pooled(args.config, args.source, args.executor, args.ray_address)


class _Lenient(argparse.ArgumentParser):
    """A parser that raises where argparse would print usage and exit."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)
