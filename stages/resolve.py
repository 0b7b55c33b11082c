"""Resolving one partition: its key, input and output folders (``resolve_task``), the identity
of the data it would produce (``data_version``), and its program module (``load_program``).

Program modules are imported by name here, only when asked for, never at module level.
"""

from __future__ import annotations

import hashlib
import importlib
import json

from stages.catalog import PROGRAMS, partition_name
from stages.spec import CrawlSpec
from stages.store import Store
from stages.task import ProgramModule, Task


def resolve_task(store: Store, spec: CrawlSpec, program: str, source: str | None) -> Task:
    """The ``Task`` of one partition: its params and key, its output folder, its inputs' folders
    (and, for a program that reads them, the folders of earlier crawls' outputs)."""
    if program not in PROGRAMS:
        raise KeyError(f"unknown program {program!r}; known: {', '.join(PROGRAMS)}")
    spec.check_partition(program, source)
    keys = spec.key_map()
    input_dirs: dict[str, dict[str | None, str]] = {}
    for dep, s in spec.upstream(program, source):
        input_dirs.setdefault(dep, {})[s] = store.partition_dir(dep, keys[(dep, s)], spec.crawl, s)
    src = source if PROGRAMS[program].level == "source" else None
    prior_dirs: dict[str, dict[str, str]] = {}
    if PROGRAMS[program].reads_prior:
        for crawl, outputs in spec.dedup_against.items():
            prior_dirs[crawl] = {}
            for name, key in outputs.items():
                prog, _, src_name = name.partition("/")
                prior_dirs[crawl][name] = store.partition_dir(prog, key, crawl, src_name or None)
    return Task(
        program=program,
        source=src,
        crawl=spec.crawl,
        params=spec.program_params(program, src),
        key=keys[(program, src)],
        output_dir=store.partition_dir(program, keys[(program, src)], spec.crawl, src),
        input_dirs=input_dirs,
        prior_dirs=prior_dirs,
    )


def load_program(name: str) -> ProgramModule:
    """The module ``stages.programs.<name>`` (imported now: this is where kernels load)."""
    return importlib.import_module(f"stages.programs.{name}")  # type: ignore[return-value]


def data_version(store: Store, task: Task) -> str:
    """Identity of the data a task would produce: its key plus its inputs' data versions.

    ``raw_documents`` fingerprints its input files instead (names, sizes, mtimes/ETags), so a
    rerun on unchanged inputs recomputes nothing and a changed file recomputes everything below.
    """
    parts: list[str] = [task.key]
    if task.program == "raw_documents":
        parts.append(load_program("raw_documents").fingerprint(task.params))  # type: ignore[attr-defined]
    for program, by_source in sorted(task.input_dirs.items()):
        for source, pdir in sorted(by_source.items(), key=lambda kv: kv[0] or ""):
            m = store.read_manifest(pdir)
            if m is None:
                raise FileNotFoundError(
                    f"{partition_name(program, task.crawl, source)} must be materialized before {task.program}"
                )
            parts.append(f"{program}/{source}={m.data_version}")
    for crawl, outputs in sorted(task.prior_dirs.items()):
        for name, pdir in sorted(outputs.items()):
            m = store.read_manifest(pdir)
            if m is None:
                raise FileNotFoundError(f"earlier crawl {crawl}: {name} is not materialized (needed by {task.program})")
            parts.append(f"{crawl}:{name}={m.data_version}")
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
