"""Custom document filters: a user's own rule in the heuristic stage, without a fork.

A filter is a class (NeMo Curator's ``DocumentFilter`` shape: ``score_document`` / ``keep_document``)::

    class DigitRatio:
        name = "digit_ratio"      # the ledger's reason is filter:digit_ratio
        version = 1               # bump when score() or keep() changes: re-keys the outputs
        keep_kwargs = ("max_ratio",)  # optional: kwargs only keep() reads (not in the score cache key)

        def __init__(self, max_ratio: float = 0.1) -> None:
            self.max_ratio = max_ratio

        def score(self, text: str) -> float:
            return sum(c.isdigit() for c in text) / len(text) if text else 0.0

        def keep(self, score: float) -> bool:
            return score <= self.max_ratio

named in the crawl config, under ``params: filtered_documents: filters:``, by ``module:Class`` or by
the name of an entry point of the group ``curation_dagster.filters`` that the user's package
declares, with optional constructor ``kwargs``. Heavy state (a model) belongs in ``__init__``:
one instance per process. Scores are cached per filter like the built-in scores, keyed by the
raw data version, the filter's reference, name, version and kwargs (less ``keep_kwargs``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import math
import numbers
import re
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from stages.errors import StageError

ENTRY_POINT_GROUP = "curation_dagster.filters"
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")  # fullmatch: "$" matches before a trailing newline


@runtime_checkable
class DocumentFilter(Protocol):
    """What a custom filter provides; ``keep_kwargs`` (a tuple of kwarg names) is optional."""

    name: str
    version: int

    def score(self, text: str) -> float: ...

    def keep(self, score: float) -> bool: ...


class FilterError(StageError):
    """A filter that cannot be imported, built or used: one line naming it. Not a ValueError, so
    that pydantic passes it through params validation unwrapped (the CLIs print it as it is)."""


class FilterFailed(FilterError):
    """A filter raised (or returned a non-number) on one document: the partition fails, naming both."""


def reason(name: str) -> str:
    """The ledger's reason for a document the filter ``name`` removed (as ``quality:<classifier>``)."""
    return f"filter:{name}"


def load_class(ref: str) -> type:
    """The class ``ref`` names: ``package.module:Class`` or an entry point name of ``ENTRY_POINT_GROUP``."""
    try:
        if ":" in ref:
            module, _, attr = ref.partition(":")
            obj: Any = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        else:
            obj = _entry_point(ref)
    except Exception as exc:  # whatever the user's module raises on import, said in one line
        raise FilterError(f"custom filter {ref!r} cannot be imported: {type(exc).__name__}: {_line(exc)}") from exc
    if not isinstance(obj, type):
        raise FilterError(f"custom filter {ref!r} is a {type(obj).__name__}, not a class")
    return obj


@functools.lru_cache(maxsize=256)
def _entry_point(ref: str) -> Any:
    """The object an entry point of ``ENTRY_POINT_GROUP`` names; cached per process, since
    resolving a crawl's partitions validates its parameters many times and a scan of the installed packages'
    metadata is not free (a failed lookup raises and is not cached)."""
    found = entry_points(group=ENTRY_POINT_GROUP, name=ref)
    if not found:
        raise LookupError(f"no entry point {ref!r} in group {ENTRY_POINT_GROUP!r} (nor module:Class)")
    return next(iter(found)).load()


def describe(ref: str, kwargs: Mapping[str, Any]) -> tuple[str, int, tuple[str, ...]]:
    """(name, version, keep_kwargs) of the class ``ref`` names, checked against the protocol and
    ``kwargs`` against its constructor, without building it (no model loaded to resolve a partition)."""
    cls = load_class(ref)
    name, version = getattr(cls, "name", None), getattr(cls, "version", None)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise FilterError(f"custom filter {ref!r}: class attribute name must be a string like 'digit_ratio', "
                          f"got {name!r}")
    if not isinstance(version, int) or isinstance(version, bool):
        raise FilterError(f"custom filter {ref!r}: class attribute version must be an int, got {version!r}")
    missing = [m for m in ("score", "keep") if not callable(getattr(cls, m, None))]
    if missing:
        raise FilterError(f"custom filter {ref!r} has no method {' or '.join(missing)} (score(text) -> float, "
                          "keep(score) -> bool)")
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        raise FilterError(f"custom filter {ref!r} does not take kwargs {dict(kwargs)}: {exc}") from exc
    keep_kwargs = tuple(getattr(cls, "keep_kwargs", ()) or ())
    return name, version, keep_kwargs


_BUILT: dict[str, Any] = {}  # one instance per filter and kwargs, per process (heavy state loaded once)


def build(ref: str, kwargs: Mapping[str, Any]) -> Any:
    """An instance of the filter, built once per process."""
    key = json.dumps([ref, dict(kwargs)], sort_keys=True)
    if key not in _BUILT:
        cls = load_class(ref)
        try:
            _BUILT[key] = cls(**kwargs)
        except Exception as exc:
            raise FilterError(f"custom filter {ref!r} failed to start with kwargs {dict(kwargs)}: "
                              f"{type(exc).__name__}: {_line(exc)}") from exc
    return _BUILT[key]


def score_one(instance: Any, name: str, doc_id: str, text: str) -> float:
    """``instance.score(text)`` as a float; FilterFailed naming the filter and document otherwise."""
    try:
        value = instance.score(text)
    except Exception as exc:
        raise FilterFailed(f"custom filter {name!r} raised {type(exc).__name__} on document {doc_id}: "
                           f"{_line(exc)}") from exc
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(float(value)):
        raise FilterFailed(f"custom filter {name!r} returned {value!r} for document {doc_id}, not a number")
    return float(value)


def keep_one(instance: Any, name: str, doc_id: str, score: float) -> bool:
    try:
        return bool(instance.keep(score))
    except Exception as exc:
        raise FilterFailed(f"custom filter {name!r} keep({score!r}) raised {type(exc).__name__} on document "
                           f"{doc_id}: {_line(exc)}") from exc


def unwrapped(exc: FilterError) -> FilterError:
    """The filter's own one-line error: Ray raises a task's exception as a subclass of both
    ``RayTaskError`` and its class whose text is the worker's traceback; the original is its
    ``cause``."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, FilterError) else exc


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
