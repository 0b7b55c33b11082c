"""Reading a config file (YAML, TOML or JSON by its suffix) as a mapping, in one place: every
failure is a ``DamagedFile`` naming the file, on one line. YAML is read with the safe loader, so a
Python tag (``!!python/object/apply:os.system``) builds nothing: it is refused, by name."""

from __future__ import annotations

import json
import os
import tomllib
from typing import Any

from stages.errors import DamagedFile

# Values (mapping keys, values and list items, counted as if every alias were copied out) a YAML
# config may hold. Aliases share one object when read, so nine nested lists of nine aliases read
# in microseconds, but anything that walks them (the model's validation, a JSON dump of the spec)
# sees 9^9 = 387M values: `curate register` took 3.4 GB and a minute before it was stopped.
MAX_VALUES = 1_000_000


class InvalidConfig(DamagedFile, ValueError):
    """A config file that parses but whose values its model refuses (a ValueError, as pydantic's are)."""


def load_mapping(path: str | os.PathLike[str], what: str = "config") -> dict[str, Any]:
    """The top-level mapping of the file at ``path`` (``{}`` for an empty YAML file): ``.yaml``
    and ``.yml`` as YAML, ``.toml`` as TOML, anything else as JSON."""
    import yaml

    name = os.fspath(path)
    try:
        with open(name, "rb") as fh:
            raw = fh.read()
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DamagedFile(name, what, f"not UTF-8 text ({exc})") from None
    except OSError as exc:
        raise DamagedFile(name, what, f"cannot be read ({exc.strerror or exc})") from None
    suffix = os.path.splitext(name)[1].lower()
    try:
        if suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
            data = {} if data is None else data
            if _expanded_values(data, MAX_VALUES) > MAX_VALUES:
                raise DamagedFile(name, what, f"it holds more than {MAX_VALUES:,} values, its aliases expanded (a "
                                  "config that large, an alias bomb, or an alias that refers to itself); "
                                  "configs are small plain data")
        elif suffix == ".toml":
            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except yaml.YAMLError as exc:
        raise DamagedFile(name, what, _yaml_reason(exc)) from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, TOMLDecodeError; nesting bombs
        raise DamagedFile(name, what, f"not {'TOML' if suffix == '.toml' else 'JSON'} ({exc})") from None
    if not isinstance(data, dict):
        raise DamagedFile(name, what, f"expected a mapping at the top level, got {type(data).__name__}")
    return data


def _expanded_values(data: Any, limit: int) -> int:
    """Values in ``data`` with every shared (aliased) object counted each time it appears, up to
    just past ``limit``: O(limit) time whatever the aliases expand to, a loop included."""
    count, stack = 0, [data]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def _yaml_reason(exc: Exception) -> str:
    """One line for a YAML error: the problem (a Python tag is named as such) and where."""
    problem = getattr(exc, "problem", None) or str(exc)
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    if "python/" in problem and "constructor for the tag" in problem:
        tag = problem.split("tag", 1)[1].strip().strip("'")
        return f"the YAML tag {tag} would build a Python object; configs are plain data{where}"
    return f"not YAML: {problem}{where}"
