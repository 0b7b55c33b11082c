"""The benchmark registry: benchmark sets given as local files, read into examples.

A benchmark (``stages.params.Benchmark``) is JSONL (optionally .gz/.zst) or Parquet; every row
is an example whose text is every string under its configured ``fields`` (``question``,
``answers``, ``passages`` by default; a field may hold a string, a number or nested lists of
them). ``sample_benchmark`` writes a small one from the sample corpus, so the sample run shows
the decontamination stage at work.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from stages.fingerprint import expand
from stages.parallel import arrow_threads
from stages.params import BENCHMARK_SUFFIXES, Benchmark


@dataclass(frozen=True)
class Example:
    benchmark: str
    example_id: str
    texts: list[str]


def _flatten(value: Any) -> Iterator[str]:
    if value is None:
        return
    if isinstance(value, str):
        if value.strip():
            yield value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield str(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _flatten(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _flatten(v)


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    name = path.name
    if name.endswith(".parquet"):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096, use_threads=arrow_threads()):
            yield from batch.to_pylist()
        return
    data = path.read_bytes()
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    elif name.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdDecompressor().stream_reader(data).read()
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: invalid JSON ({exc})") from exc
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object per line")
        yield row


def load_examples(benchmark: Benchmark) -> list[Example]:
    """Every example of one benchmark, in file then row order. Example ids: ``id_field``'s value
    or, when a row lacks it, the row number across all files of the benchmark."""
    out: list[Example] = []
    number = 0
    for path in expand(benchmark.path, BENCHMARK_SUFFIXES):
        for row in _rows(path):
            texts = [t for f in benchmark.fields for t in _flatten(row.get(f))]
            ident = row.get(benchmark.id_field) if benchmark.id_field else None
            out.append(Example(benchmark.name, str(ident) if ident is not None else str(number), texts))
            number += 1
    return out


# --------------------------------------------------------------------------- the sample's benchmark

SAMPLE_BENCHMARK = "sample_qa"
_SENTENCE_WORDS = 40


def _edit(passage: str, k: int) -> str:
    """A lightly edited copy, as benchmark copies on the web are: upper-case the first word,
    drop commas, and change one word near the middle."""
    words = passage.replace(",", "").split()
    words[0] = words[0].upper()
    words[len(words) // 2] = f"altered{k}"
    return " ".join(words)


def sample_benchmark(docstrings: Path, out: Path, examples: int = 6) -> Path:
    """Write ``out`` (JSONL): ``examples`` examples whose passages are lightly edited spans of
    the sample's docstrings (so those documents are contaminated), plus two that occur nowhere.

    Deterministic: the same docstrings folder gives the same file.
    """
    texts: list[tuple[str, str]] = []
    for part in sorted(docstrings.glob("part-*")):
        data = gzip.decompress(part.read_bytes()) if part.name.endswith(".gz") else part.read_bytes()
        for line in data.splitlines():
            rec = json.loads(line)
            words = re.sub(r"\s+", " ", rec["text"]).split()
            # Plain prose, long enough: the heuristic filters keep such documents.
            if len(words) >= 120 and rec["text"].count(">>>") == 0:
                texts.append((rec["id"], " ".join(words)))
    step = max(1, len(texts) // max(examples, 1))
    rows: list[dict[str, Any]] = []
    for k, (doc, text) in enumerate(texts[::step][:examples]):
        words = text.split()
        mid = len(words) // 2
        passage = " ".join(words[mid - _SENTENCE_WORDS // 2 : mid + _SENTENCE_WORDS // 2])
        rows.append({"id": f"q{k}", "question": f"Which documentation says this? (from {doc})",
                     "answers": [doc], "passages": [_edit(passage, k)]})
    rows.append({"id": "clean0", "question": "What is the boiling point of water at sea level in kelvin?",
                 "answers": ["373.15"], "passages": [
                     "Water boils at one hundred degrees Celsius at standard atmospheric pressure which is "
                     "three hundred seventy three point one five kelvin in the absolute temperature scale"]})
    rows.append({"id": "clean1", "question": "Who wrote the novel about the white whale?",
                 "answers": ["Herman Melville"], "passages": [
                     "Moby Dick tells of the voyage of the whaling ship Pequod and its captain Ahab who seeks "
                     "revenge on the white whale that took his leg on a previous voyage"]})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return out
