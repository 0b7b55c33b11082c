"""A small real-text sample corpus built from what every Python installation carries.

``build_sample(out)`` writes four sources, one folder each, as JSONL parts (one part gzipped):

- ``docstrings``: module, class and function docstrings of the standard library (>= 200 chars),
  read with ``ast`` from the stdlib sources, never imported.
- ``licenses``: license files of the installed distributions. MIT/BSD/Apache texts that differ
  only in the copyright line give natural near-duplicates, identical copies exact duplicates.
- ``package_docs``: summary and long description of the installed distributions.
- ``scraps``: planted junk (short, symbol, lorem ipsum, bullet-only, repeated-line texts) and
  planted bad lines (invalid JSON, non-string, empty and missing text, invalid UTF-8), so a run
  on the sample shows heuristic removals and quarantine.

``write_configs(out, folders)`` writes the ``curate run --config`` files for it: every source and
a small benchmark, and the same with the quality classifier ``make run`` trains.

The output is deterministic: the same installation gives byte-identical files on every run.
Nothing is deduplicated; duplicates are the point.
"""

from __future__ import annotations

import ast
import email.parser
import email.policy
import gzip
import importlib.metadata
import json
import os
import re
import sys
import sysconfig
import textwrap
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

SOURCES = ("docstrings", "licenses", "package_docs", "scraps")
MIN_DOCSTRING_CHARS = 200
# Kinds of bad lines planted in ``scraps``; each occurs exactly once.
PLANTED_BAD = ("invalid_json", "text_not_string", "empty_text", "missing_text", "invalid_utf8")

# Where `make run` trains the sample's quality classifier (under the sample folder), and the
# threshold its config keeps documents at: P(hq) >= 0.5, the training threshold.
SAMPLE_MODEL = "quality/model.bin"
SAMPLE_MIN_SCORE = 0.5

_SKIP_STDLIB_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
_LICENSE_NAME = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE)", re.IGNORECASE)
_MAX_FILE_BYTES = 1 << 20

Record = dict[str, Any]


def build_sample(out: Path, *, max_docs_per_source: int = 1500, copies: int = 1) -> dict[str, Path]:
    """Write the sample sources under ``out`` and return ``{source_name: folder}``.

    Each real source is capped at ``max_docs_per_source`` records (the first ones in sorted
    order). ``copies > 1`` appends copies ``#1 .. #copies-1`` of every real record, each with a
    distinct trailing line, to build larger benchmark corpora; ``scraps`` is never copied.
    """
    if max_docs_per_source < 0 or copies < 1:
        raise ValueError("max_docs_per_source must be >= 0 and copies >= 1")
    out = Path(out)
    dists = _distributions()
    real: dict[str, list[Record]] = {
        "docstrings": list(_take(_docstring_records(), max_docs_per_source)),
        "licenses": list(_take(_license_records(dists), max_docs_per_source)),
        "package_docs": list(_take(_package_doc_records(dists), max_docs_per_source)),
    }
    folders: dict[str, Path] = {}
    for name, records in real.items():
        lines = [_dump(r) for r in _with_copies(records, copies)]
        folders[name] = _write_parts(out / name, lines)
    folders["scraps"] = _write_parts(out / "scraps", _scrap_lines())
    return folders


# --------------------------------------------------------------------------- helpers


def write_configs(out: Path, folders: dict[str, Path]) -> tuple[Path, Path]:
    """``out/curate.json`` (every source of ``folders``, and a small benchmark of lightly edited
    docstring passages written under ``out/benchmarks``, so the sample run shows decontam) and
    ``out/curate-quality.json`` (the same with the classifier at ``out/SAMPLE_MODEL``)."""
    from stages.decontam_sets import SAMPLE_BENCHMARK, sample_benchmark

    config: dict[str, Any] = {"sources": {name: {"url": str(path.resolve()), "text_field": "text", "id_field": "id",
                                 "url_field": "url"} for name, path in folders.items()}}
    bench = sample_benchmark(folders["docstrings"], out / "benchmarks" / f"{SAMPLE_BENCHMARK}.jsonl")
    config["params"] = {"contaminated_documents": {"benchmarks": [
        {"name": SAMPLE_BENCHMARK, "path": str(bench.resolve())}]}}
    plain = out / "curate.json"
    plain.write_text(json.dumps(config, indent=1))
    # The same with the quality classifier `make run` trains on a first pass's survivors
    # (`curate train-quality --positive docstrings --negative package_docs --out SAMPLE_MODEL`).
    model = str((out / SAMPLE_MODEL).resolve())
    quality = {"classifiers": [{"name": "sample-quality", "kind": "fasttext", "path": model, "label": "hq",
                                "min_score": SAMPLE_MIN_SCORE}]}
    with_quality = out / "curate-quality.json"
    with_quality.write_text(json.dumps({**config, "params": {**config["params"], "quality_scores": quality}}, indent=1))
    return plain, with_quality


def _take(records: Iterator[Record], n: int) -> Iterator[Record]:
    """First ``n`` records; stops the (lazy) producer early so capping also saves time."""
    for i, rec in enumerate(records):
        if i >= n:
            return
        yield rec


def _usable(text: str) -> bool:
    """Text worth a record: not blank, no NULs, and encodable as strict UTF-8 (no lone surrogates)."""
    if not text.strip() or "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_utf8(path: Path) -> str | None:
    """File text if it is a readable, reasonably small, valid UTF-8 file; else None (skipped)."""
    try:
        if path.stat().st_size > _MAX_FILE_BYTES:
            return None
        return path.read_bytes().decode("utf-8").replace("\r\n", "\n")
    except (OSError, UnicodeDecodeError):
        return None


def _dump(rec: Record) -> bytes:
    return json.dumps(rec, ensure_ascii=False).encode("utf-8") + b"\n"


def _with_copies(records: list[Record], copies: int) -> Iterator[Record]:
    """Originals first, then each copy round in full, so copies spread over all parts."""
    yield from records
    for k in range(1, copies):
        for rec in records:
            yield {**rec, "text": f"{rec['text']}\n\nRetrieved copy {k}", "id": f"{rec['id']}#{k}"}


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _write_parts(folder: Path, lines: list[bytes]) -> Path:
    """Split ``lines`` in order into up to three parts; the second is gzipped to exercise gzip."""
    folder.mkdir(parents=True, exist_ok=True)
    n_parts = min(3, max(1, len(lines)))
    names = []
    for i in range(n_parts):
        chunk = b"".join(lines[i * len(lines) // n_parts : (i + 1) * len(lines) // n_parts])
        name = f"part-{i:05d}.jsonl"
        if i == 1:
            name += ".gz"
            # mtime=0 and no file name in the header keep the bytes identical across runs.
            chunk = gzip.compress(chunk, compresslevel=6, mtime=0)
        _write_atomic(folder / name, chunk)
        names.append(name)
    # Parts left by an earlier run with a different layout would be read as input; drop them.
    for stale in folder.glob("part-*"):
        if stale.name not in names:
            stale.unlink()
    return folder


# --------------------------------------------------------------------------- docstrings


def _docstring_records() -> Iterator[Record]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[str] = []
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in _SKIP_STDLIB_DIRS]
        rel_root = Path(root).relative_to(stdlib).as_posix()
        files.extend(f"{rel_root}/{n}".removeprefix("./") for n in names if n.endswith(".py"))
    for rel in sorted(files):
        source = _read_utf8(stdlib / rel)
        if source is None:
            continue
        try:
            with warnings.catch_warnings():
                # Invalid escape sequences in old modules warn at parse time; irrelevant here.
                warnings.simplefilter("ignore")
                tree = ast.parse(source, filename=rel)
        except (SyntaxError, ValueError, RecursionError):
            continue
        module = rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        seen: dict[str, int] = {}
        for qualname, doc in _docstrings(tree, ""):
            if len(doc) < MIN_DOCSTRING_CHARS or not _usable(doc):
                continue
            # Conditional definitions (if/else per platform) repeat a qualname; keep ids unique.
            seen[qualname] = seen.get(qualname, 0) + 1
            suffix = f"~{seen[qualname]}" if seen[qualname] > 1 else ""
            anchor = f"#{qualname}{suffix}" if qualname else ""
            yield {
                "text": doc,
                "id": f"{module}:{qualname or '<module>'}{suffix}",
                "url": f"py://stdlib/{rel}{anchor}",
            }


def _docstrings(node: ast.AST, prefix: str) -> Iterator[tuple[str, str]]:
    """(qualname, docstring) of a module and every class/function in it, in source order."""
    if isinstance(node, ast.Module) and (doc := ast.get_docstring(node)):
        yield "", doc
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            qualname = prefix + child.name
            if doc := ast.get_docstring(child):
                yield qualname, doc
            inner = qualname + (".<locals>." if not isinstance(child, ast.ClassDef) else ".")
            yield from _docstrings(child, inner)
        else:
            # Definitions nested in if/try/with blocks still belong to the same scope.
            yield from _docstrings(child, prefix)


# --------------------------------------------------------------------------- distributions


@dataclass(frozen=True)
class _Dist:
    """An installed distribution with its parsed metadata and dist-info folder."""

    name: str
    version: str
    meta: Message
    info_dir: Path | None


def _distributions() -> list[_Dist]:
    """Installed distributions, sorted by name and version; shadowed duplicates dropped.

    Only absolute ``sys.path`` entries are searched, so the working directory (``''``) cannot
    change the result.
    """
    path = [p for p in sys.path if os.path.isabs(p)]
    found: dict[str, _Dist] = {}
    for dist in importlib.metadata.distributions(path=path):
        try:
            raw = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
        except (OSError, UnicodeDecodeError):
            continue
        if not raw:
            continue
        meta = email.parser.Parser(policy=email.policy.compat32).parsestr(raw)
        name, version = meta.get("Name"), meta.get("Version")
        if not name or not version:
            continue
        key = re.sub(r"[-_.]+", "-", name).lower()
        # First on sys.path wins, as for imports; a shadowed copy would only clash on ids.
        if key not in found:
            info = getattr(dist, "_path", None)
            found[key] = _Dist(str(name), str(version), meta, Path(info) if info else None)
    return sorted(found.values(), key=lambda d: (d.name.lower(), d.version, d.name))


def _license_records(dists: list[_Dist]) -> Iterator[Record]:
    for dist in dists:
        if dist.info_dir is None or not dist.info_dir.is_dir():
            continue
        rels = []
        for root, dirs, names in os.walk(dist.info_dir):
            dirs.sort()
            for n in names:
                rel = (Path(root) / n).relative_to(dist.info_dir).as_posix()
                if _LICENSE_NAME.match(n) or rel.startswith("licenses/"):
                    rels.append(rel)
        for rel in sorted(rels):
            text = _read_utf8(dist.info_dir / rel)
            if text is None or not _usable(text):
                continue
            yield {
                "text": text,
                "id": f"{dist.name}=={dist.version}/{rel}",
                "url": f"py://dist/{dist.name}/{dist.version}/{rel}",
            }


def _long_description(meta: Message) -> str:
    """The long description: the METADATA payload, else the (folded) ``Description`` header."""
    payload = meta.get_payload()
    text = payload if isinstance(payload, str) else ""
    if not text.strip():
        header = meta.get("Description")
        text = str(header) if header else ""
        # Metadata 1.x folds continuation lines with 8 spaces, sometimes followed by '|'.
        first, _, rest = text.partition("\n")
        rest = re.sub(r"(?m)^ {7}\|", "", rest) if re.search(r"(?m)^ {7}\|", rest) else textwrap.dedent(rest)
        text = f"{first}\n{rest}" if rest else first
    text = text.replace("\r\n", "\n").strip()
    return "" if text == "UNKNOWN" else text


def _package_doc_records(dists: list[_Dist]) -> Iterator[Record]:
    for dist in dists:
        summary = str(dist.meta.get("Summary") or "").strip()
        summary = "" if summary == "UNKNOWN" else summary
        text = "\n\n".join(t for t in (summary, _long_description(dist.meta)) if t)
        if not _usable(text):
            continue
        yield {
            "text": text,
            "id": f"{dist.name}=={dist.version}",
            "url": f"py://dist/{dist.name}/{dist.version}/METADATA",
            "title": dist.name,
        }


# --------------------------------------------------------------------------- scraps

_LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco "
    "laboris nisi ut aliquip ex ea commodo consequat. Duis aute irure dolor in reprehenderit in "
    "voluptate velit esse cillum dolore eu fugiat nulla pariatur. Excepteur sint occaecat cupidatat "
    "non proident, sunt in culpa qui officia deserunt mollit anim id est laborum."
)


def _scrap_lines() -> list[bytes]:
    """Junk records that heuristics should drop, interleaved with bad lines for quarantine."""

    def rec(key: str, **fields: Any) -> bytes:
        return _dump({**fields, "id": f"scraps:{key}", "url": f"py://scraps/{key}"})

    return [
        rec("short-1", text="Click here"),
        rec("symbols", text="\n".join(["#### $$$$ %%%% &&&& **** ####"] * 8)),
        # invalid_json: a record cut off mid-string.
        b'{"text": "this record was cut off in the middle of a str\n',
        rec("lorem-ipsum", text=_LOREM),
        # text_not_string
        rec("text-number", text=42),
        rec("bullets-only", text="\n".join(f"- item {i}" for i in range(1, 13))),
        # empty_text
        rec("text-empty", text=""),
        rec("repeated-line", text="\n".join(["Buy cheap watches now at the best price!"] * 30)),
        # missing_text
        rec("text-missing", title="a record without any text field"),
        rec("short-2", text="ok"),
        # invalid_utf8: Latin-1 bytes inside an otherwise valid JSON line.
        b'{"text": "caf\xe9 cr\xe8me br\xfbl\xe9e \xff\xfe", "id": "scraps:bad-utf8", "url": "py://scraps/bad-utf8"}\n',
        rec("short-3", text="Home | About | Contact"),
    ]
