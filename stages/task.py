"""What a program's ``run`` receives: its committed inputs, its partition, and the resolved task.

Every program module has ``run(params, inputs, output, partition, execution) -> report``
(``ProgramModule``); ``stages.resolve`` resolves a ``Task``, ``stages.execute`` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from stages import params as P
from stages.progress import Progress
from stages.reports import Report
from stages.spec import CrawlSpec
from stages.store import Manifest, PartitionWriter, Store


class Inputs:
    """The committed upstream partitions of one task, by program and source; ``prior`` holds
    the output dirs of earlier crawls ({crawl: {"program/source": dir}}) for incremental dedup."""

    def __init__(
        self, store: Store, dirs: dict[str, dict[str | None, str]], prior: dict[str, dict[str, str]] | None = None
    ) -> None:
        self.store = store
        self.dirs = dirs
        self.prior = prior or {}

    def dir(self, program: str, source: str | None = None) -> str:
        return self.dirs[program][source]

    def sources(self, program: str) -> list[str]:
        return [s for s in self.dirs[program] if s is not None]

    def manifest(self, program: str, source: str | None = None) -> Manifest:
        m = self.store.read_manifest(self.dir(program, source))
        if m is None:
            raise FileNotFoundError(f"{program}[{source or 'crawl'}] has not been materialized")
        return m

    def read(
        self, program: str, table: str, source: str | None = None, columns: list[str] | None = None
    ) -> pa.Table:
        """All rows of ``table`` of one committed input partition (``columns`` only, if given)."""
        return self.store.read_table(self.dir(program, source), table, columns)


@dataclass(frozen=True)
class Partition:
    """Which partition a program runs on (``source`` is None for a crawl-level program)."""

    crawl: str
    source: str | None
    spec: CrawlSpec
    # Where a long program says how far it is (``expect``/``advance``); silent by default.
    progress: Progress = field(default_factory=Progress, compare=False)


class ProgramModule(Protocol):
    """A module under ``stages/programs/``; ``run`` returns the partition's report."""

    def run(
        self,
        params: Any,
        inputs: Inputs,
        output: PartitionWriter,
        partition: Partition,
        execution: P.ExecutionParams,
    ) -> Report: ...


@dataclass(frozen=True)
class Task:
    """One partition of one program, fully resolved."""

    program: str
    source: str | None
    crawl: str
    params: P.ProgramParams
    key: str
    output_dir: str
    input_dirs: dict[str, dict[str | None, str]]
    prior_dirs: dict[str, dict[str, str]] = field(default_factory=dict)
