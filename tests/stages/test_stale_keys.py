"""Stale intermediates cannot be read: EVERY parameter of EVERY program re-keys that program's
outputs and everything downstream of them, and nothing else; execution settings re-key nothing.

The parameters are enumerated from the params classes (``model_fields``), so a parameter added
later is covered automatically, and one this test cannot vary fails it until it is taught how.
"""

from __future__ import annotations

import re
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from stages import params as P
from stages import versions
from stages.catalog import PROGRAMS, STAGES
from stages.execute import execute_crawl
from stages.params import ExecutionParams, KeepParams, RawDocumentsParams
from stages.resolve import resolve_task
from stages.spec import CrawlSpec
from stages.store import Store
from tests.support.tiny_corpus import SOURCES, read, spec

Part = tuple[str, str | None]
DERIVED = {"fingerprint"}  # from file contents (tests/stages/programs/test_quality.py, test_semantic.py), never set


def special_values(tmp: Path) -> dict[tuple[str, str], Any]:
    """Changed values for fields whose type has no generic alternative."""
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    (tmp / "q.bin").write_bytes(b"a stand-in model file")
    (tmp / "bench.jsonl").write_text('{"id": 1, "question": "q"}\n')
    (tmp / "other").mkdir(exist_ok=True)
    plugin = str(Path(__file__).resolve().parents[1] / "data" / "plugin_pkg")  # tests/stages/test_custom_filters.py's
    if plugin not in sys.path:
        sys.path.append(plugin)
    return {
        ("RawDocumentsParams", "url"): str(tmp / "other"),
        ("RawDocumentsParams", "text_field"): "body",
        ("RawDocumentsParams", "id_field"): "rid",
        ("RawDocumentsParams", "url_field"): "link",
        ("DocumentEmbeddingsParams", "model"): str(model),
        ("QualityScoresParams", "classifiers"): ({"name": "q", "kind": "fasttext", "path": str(tmp / "q.bin")},),
        ("ContaminatedDocumentsParams", "benchmarks"): ({"name": "b", "path": str(tmp / "bench.jsonl")},),
        ("KeepParams", "source_priority"): {"a": 1},
        ("DocumentLanguagesParams", "languages"): ("en",),
        ("FilteredDocumentsParams", "filters"): ({"filter": "curate_plugin_filters:DigitShare"},),
        ("DocumentLanguagesParams", "model"): str(tmp / "q.bin"),  # any local file: fingerprinted, not loaded
    }


def candidates(annotation: Any, default: Any) -> list[Any]:
    if isinstance(default, bool):
        return [not default]
    options = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return [o for o in options if o != default]
    if isinstance(default, int):
        return [default + 1, default - 1, default * 2]
    if isinstance(default, float):
        return [round(default * 0.9, 6), round(default + 0.01, 6), default / 2]
    if default is None:
        return [7, 0.5, "x"]
    return []


def changed_value(cls: type[BaseModel], name: str, specials: dict[tuple[str, str], Any], base: dict[str, Any]) -> Any:
    """A value of ``cls.name`` that validates and changes the canonical parameters."""
    field = cls.model_fields[name]
    default = base.get(name, field.get_default(call_default_factory=True))
    options = [specials[(cls.__name__, name)]] if (cls.__name__, name) in specials else \
        candidates(field.annotation, default)
    reference = cls(**base).model_dump()
    for value in options:
        try:
            changed = cls(**{**base, name: value})
        except ValidationError:
            continue
        if changed.model_dump() != reference:
            return value
    raise AssertionError(f"no changed value for {cls.__name__}.{name} (default {default!r}): teach this test")


def base_spec(tmp: Path, **extra: Any) -> CrawlSpec:
    return CrawlSpec(crawl="c1", sources={"a": RawDocumentsParams(url=str(tmp / "a")),
                                          "b": RawDocumentsParams(url=str(tmp / "b"))}, **extra)


def affected(crawl: CrawlSpec, start: set[Part]) -> set[Part]:
    """``start`` and every partition that reads one of them, transitively (from Program.deps)."""
    out = set(start)
    for name in PROGRAMS:  # topological order
        for source in crawl.partitions(name):
            if set(crawl.upstream(name, source)) & out:
                out.add((name, source))
    return out


def rekeyed(a: CrawlSpec, b: CrawlSpec) -> set[Part]:
    ka, kb = a.keys(), b.keys()
    assert ka.keys() == kb.keys()
    return {part for part in ka if ka[part] != kb[part]}


def every_parameter() -> list[tuple[str, str]]:
    fields = [("raw_documents", name) for name in RawDocumentsParams.model_fields]
    for program, prog in PROGRAMS.items():
        if program != "raw_documents":
            fields += [(program, name) for name in prog.params.model_fields if name not in DERIVED]
    fields += [("keep", name) for name in KeepParams.model_fields]
    return fields


def test_every_params_class_is_enumerated() -> None:
    classes = {obj for obj in vars(P).values()
               if isinstance(obj, type) and issubclass(obj, P.ProgramParams) and obj is not P.ProgramParams}
    covered = {prog.params for prog in PROGRAMS.values()} | {KeepParams}
    assert classes == covered  # every params class of stages/params.py keys some output
    assert len(every_parameter()) > 60


@pytest.mark.parametrize(("program", "name"), every_parameter())
def test_a_changed_parameter_rekeys_its_program_and_everything_downstream(
    tmp_path: Path, program: str, name: str
) -> None:
    specials = special_values(tmp_path)
    base = base_spec(tmp_path)
    if name == "enabled":  # set from the crawl's stage list, never given as a parameter
        word = PROGRAMS[program].stage or PROGRAMS[program].part_of
        assert word in STAGES
        changed = base_spec(tmp_path, stages=tuple(s for s in STAGES if s != word))
        start = {(p, s) for p, prog in PROGRAMS.items() if word in (prog.stage, prog.part_of)
                 for s in base.partitions(p)}
    elif program == "raw_documents":
        value = changed_value(RawDocumentsParams, name, specials, {"url": str(tmp_path / "a")})
        changed = CrawlSpec(crawl="c1", sources={**base.sources, "a": RawDocumentsParams(
            **{**base.sources["a"].model_dump(), name: value})})
        start = {("raw_documents", "a")}
    elif program == "keep":
        changed = base_spec(tmp_path, keep=KeepParams(**{name: changed_value(KeepParams, name, specials, {})}))
        start = {(p, s) for p, prog in PROGRAMS.items() if prog.uses_keep_rule for s in base.partitions(p)}
    else:
        cls = PROGRAMS[program].params
        # A field that only applies in another mode is changed in that mode (rules: datatrove)
        mode = {"rules": "datatrove"} if name in getattr(cls, "datatrove_only", ()) else {}
        changed = base_spec(tmp_path, params={program: {**mode, name: changed_value(cls, name, specials, mode)}})
        start = {(program, s) for s in base.partitions(program)}
    want = affected(base, start)
    got = rekeyed(base, changed)
    assert got == want, (sorted(got - want), sorted(want - got))
    assert ("removal_ledger", None) in got  # the output always follows
    upstream = {part for part in base.keys() if part not in want}
    assert not got & upstream


def test_a_version_bump_rekeys_like_a_parameter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = base_spec(tmp_path)
    before = base.keys()
    monkeypatch.setattr(P.ExactDuplicatesParams, "version", P.ExactDuplicatesParams.version + 1)
    after = base.keys()
    assert {part for part in before if before[part] != after[part]} == affected(base, {("exact_duplicates", None)})


@pytest.mark.parametrize("constant", sorted({c for names in versions.USES.values() for c in names}))
def test_a_code_version_bump_rekeys_its_programs_and_everything_downstream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, constant: str
) -> None:
    """Scorer, kernel and format versions (stages/versions.py) key outputs like parameters do, so
    a changed rule set never shares a key (and a crawl never mixes two)."""
    base = base_spec(tmp_path)
    before = base.keys()
    monkeypatch.setattr(versions, constant, getattr(versions, constant) + 1)
    after = base.keys()
    users = {p for p, names in versions.USES.items() if constant in names}
    assert users and users <= set(PROGRAMS)
    start = {(p, s) for p in users for s in base.partitions(p)}
    assert {part for part in before if before[part] != after[part]} == affected(base, start)


def test_kernels_take_their_versions_from_stages_versions() -> None:
    """A version constant written as a number anywhere but stages/versions.py would not key
    anything: bumping it would leave stale outputs looking current."""
    root = Path(__file__).resolve().parents[2] / "stages"
    literal = re.compile(r"^\s*[A-Z_]*VERSION\w*\s*(:\s*int\s*)?=\s*\d", re.MULTILINE)
    offenders = [str(path.relative_to(root)) for path in root.rglob("*.py")
                 if path.name != "versions.py" and literal.search(path.read_text())]
    assert offenders == []
    from stages.kernels import decontam, heuristics
    from stages.programs import quality_scores

    assert heuristics.SCORER_VERSION == versions.HEURISTIC_SCORER
    assert decontam.HASH_VERSION == versions.DECONTAM_HASH
    assert quality_scores.SCORER_VERSION == versions.QUALITY_SCORER


# --- execution settings ---------------------------------------------------------------------------


def execution_variant() -> ExecutionParams:
    """Every execution setting changed at once (except the executor, covered by the Ray tests)."""
    base = ExecutionParams()
    values: dict[str, Any] = {}
    for name, field in ExecutionParams.model_fields.items():
        if name == "executor":
            continue
        if name == "ray_address":
            values[name] = "auto"  # unused by the local executor
            continue
        default = getattr(base, name)
        values[name] = next(v for v in candidates(field.annotation, default) if v not in (0, -1, "x"))
    values.update(batch_rows=5, workers=2, ingest_task_bytes=2048, backend="auto")
    return ExecutionParams(**values)


def test_no_execution_setting_is_a_parameter() -> None:
    execution = set(ExecutionParams.model_fields)
    for prog in PROGRAMS.values():
        assert not execution & set(prog.params.model_fields), prog.name
    assert not execution & set(CrawlSpec.model_fields)


@pytest.mark.slow  # the tiny corpus three times through heuristic, exact and fuzzy
def test_execution_settings_change_no_key_and_no_output(tmp_path: Path) -> None:
    crawl = spec(stages=("heuristic", "exact", "fuzzy"))
    variant = execution_variant()
    store = Store(str(tmp_path / "a"))
    first = execute_crawl(store, crawl, ExecutionParams(workers=1))
    again = execute_crawl(store, crawl, variant)
    assert all(o.skipped for o in again.values())  # same keys, same data versions: nothing to do
    assert {k: o.manifest.params_key for k, o in again.items()} == {k: o.manifest.params_key for k, o in first.items()}
    other = Store(str(tmp_path / "b"))
    fresh = execute_crawl(other, crawl, variant)
    for (program, source), outcome in fresh.items():
        assert not outcome.skipped
        assert outcome.manifest.data_version == first[(program, source)].manifest.data_version
        assert outcome.manifest.rows == first[(program, source)].manifest.rows, program
    for s in SOURCES:
        assert read(other, crawl, "curated_documents", "documents", s).equals(
            read(store, crawl, "curated_documents", "documents", s))
    assert read(other, crawl, "removal_ledger", "ledger").equals(read(store, crawl, "removal_ledger", "ledger"))
    ledger_key = resolve_task(store, crawl, "removal_ledger", None).key
    assert resolve_task(other, crawl, "removal_ledger", None).key == ledger_key


def test_a_copy_with_other_parameters_has_its_own_keys() -> None:
    """The keys are cached per spec (its JSON, kept on the frozen instance): a ``model_copy`` with
    an update must not reuse the JSON of the spec it was copied from."""
    base = spec(stages=("heuristic", "exact", "fuzzy"))
    before = base.keys()
    changed = base.model_copy(update={"params": {"lsh_buckets": {"bands": 10}}})
    assert rekeyed(base, changed) and ("lsh_buckets", None) in rekeyed(base, changed)
    assert base.keys() == before and base.key_map()[("lsh_buckets", None)] == before[("lsh_buckets", None)]
    # The cache is no field: a spec that derived its keys equals the same spec read back.
    assert base == CrawlSpec.model_validate(base.model_dump()) and base != changed


def test_adopted_keys_hold_only_while_what_they_were_derived_for_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool worker adopts its pool's keys (``adopt_keys``) instead of deriving them on its first
    partition; a params version (or a model file, or the code) changed since means new keys,
    derived here."""
    from stages import spec as spec_module

    base = base_spec(tmp_path)
    ident, keys = base.derived_keys()
    monkeypatch.setattr(spec_module, "_KEYS", {})  # another process: nothing derived yet
    spec_module.adopt_keys(ident, keys)
    derived: list[CrawlSpec] = []
    real = CrawlSpec._derive_keys
    monkeypatch.setattr(CrawlSpec, "_derive_keys", lambda self: derived.append(self) or real(self))
    copy = CrawlSpec.model_validate(base.model_dump())  # as the worker unpickles it
    assert copy.keys() == keys and not derived
    monkeypatch.setattr(P.ExactDuplicatesParams, "version", P.ExactDuplicatesParams.version + 1)
    after = copy.keys()
    assert len(derived) == 1 and after[("exact_duplicates", None)] != keys[("exact_duplicates", None)]
