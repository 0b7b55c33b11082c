"""Reading back what the recorder shows as a Markdown table (``curation_dagster.run.recorder._table``):
a source x crawl partition's ``counts``."""

from __future__ import annotations

import re
from typing import Any


def md_table(value: Any) -> dict[str, float]:
    """``{key: number}`` of a two-column Markdown table of numbers (``| `key` | 12 |`` rows), from
    a ``MarkdownMetadataValue`` or its text."""
    text = getattr(value, "md_str", value)
    return {k: float(v) for k, v in re.findall(r"^\| `([^`]+)` \| (-?[0-9.eE+-]+) \|$", str(text), re.M)}
