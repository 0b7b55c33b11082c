"""``curate size``: the seeds' sizing arithmetic for a crawl before hardware is reserved.

The formulas are ``stages.sizing``'s; this module reads the config, parses ``--model`` and prints
the figures, with each stage pod's estimated memory beside the memory its program requests
(``stages.catalog.Resources``).
"""

from __future__ import annotations

import sys
from typing import Any

from stages.catalog import PROGRAMS
from stages.sizing import GIB, Assumptions, Crawl, Model, Sizing, setting_from_config, size


def parse_model(text: str) -> Model:
    """``NAME=PARAMS[:MAX_TOKENS]`` (PARAMS may be ``140e6`` or ``140M``) as a sized model."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"--model expects NAME=PARAMS[:MAX_TOKENS], got {text!r}")
    count, _, tokens = rest.partition(":")
    scale = {"K": 1e3, "M": 1e6, "B": 1e9}.get(count[-1:].upper(), 1.0)
    params = float(count[:-1] if scale != 1.0 else count) * scale
    return Model(name, int(params), int(tokens) if tokens else 512)


def sizing(docs: int, mean_chars: float, config: dict[str, Any], assumptions: Assumptions,
           models: tuple[Model, ...] = ()) -> Sizing:
    """The sizing of a crawl of ``docs`` documents of ``mean_chars`` characters under ``config``
    (a ``curate run --config`` file's content), sizing ``models`` beside the embedding model."""
    if docs < 0 or mean_chars < 0:
        raise ValueError("--docs and --mean-chars must be >= 0")
    return size(Crawl(docs, mean_chars), setting_from_config(config, models), assumptions)


def memory_rows(s: Sizing) -> list[tuple[str, float, float]]:
    """(program, estimated GiB, requested GiB) per sized program."""
    return [(name, est / GIB, PROGRAMS[name].resources.memory_gib) for name, est in s.memory_bytes.items()]


def as_json(s: Sizing) -> dict[str, Any]:
    out = s.as_dict()
    out["memory_gib"] = {name: {"estimated": round(est, 4), "requested": req} for name, est, req in memory_rows(s)}
    return out


def _n(x: float) -> str:
    """A count or a size in round numbers: 1.08e9 -> 1.08 G."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g}"


def print_sizing(s: Sizing) -> None:
    from rich.console import Console
    from rich.table import Table

    a, st, c = s.assumptions, s.setting, s.crawl
    console = Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title=f"sizing: {c.docs:,} documents x {c.mean_chars:g} characters")
    table.add_column("FIGURE")
    table.add_column("VALUE", justify="right")
    table.add_column("HOW")
    rows = [
        ("signature table", f"{_n(s.signatures['bytes'])}B", f"docs x (4 x {st.num_perm} + 36) bytes"),
        ("band keys", _n(s.band_keys["keys"]), f"docs x {st.bands} bands"),
        ("band-key volume", f"{_n(s.band_keys['bytes'])}B", f"docs x 8 x (1 + {st.bands}) bytes"),
        ("LSH threshold", f"{s.candidates['threshold']:.3f}", f"(1/{st.bands})^(1/{st.rows})"),
        ("P(candidate) of a duplicate", f"{s.candidates['p_candidate']:.4f}",
         f"1 - (1 - {a.dup_similarity:g}^{st.rows})^{st.bands}"),
        ("candidate pairs", _n(s.candidates["candidate_pairs"]), f"docs x dup rate {a.dup_rate:g} x P"),
        ("band edges (anchor)", _n(s.candidates["band_edges"]),
         f"docs x {a.dup_rate:g} x {st.bands} x {a.dup_similarity:g}^{st.rows}"),
        ("verified documents", _n(s.verification["documents"]), "2 x pairs" if st.verify else "verify off"),
        ("verification text", f"{_n(s.verification['text_bytes'])}B",
         f"verified x {c.mean_chars:g} chars x {a.bytes_per_char:g}"),
        ("verification spill", f"{_n(s.verification['spill_bytes'])}B",
         f"2 x text beyond text_block_bytes {_n(st.text_block_bytes)}B"),
    ]
    for name, e in s.embeddings.items():
        rows += [
            (f"{name}: documents", _n(e["documents"]), "docs - removed by fuzzy"),
            (f"{name}: FLOPs", f"{e['flops']:.3g}",
             f"2 x params x {e['tokens_per_document']:g} tokens ({a.tokens_per_char:g} tokens/char)"),
            (f"{name}: GPU-hours", f"{e['gpu_hours']:.3g}", f"at {a.gpu_tflops:g} TFLOP/s x {a.utilisation:.2f}"),
        ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    mem = Table(title="memory per stage pod (one partition, dominant buffers)")
    for col in ("PROGRAM", "ESTIMATED GiB", "REQUESTED GiB", ""):
        mem.add_column(col, justify="left" if col == "PROGRAM" else "right")
    for name, est, req in memory_rows(s):
        mem.add_row(name, f"{est:.3f}", f"{req:g}", "raise it" if est > req else "")
    console.print(mem)
    console.print(f"assumptions: {a.dup_rate:g} of documents near-duplicate another at Jaccard {a.dup_similarity:g} "
                  f"(--dup-rate, --dup-similarity); {a.tokens_per_char:g} tokens per character (--tokens-per-char); "
                  f"{a.bytes_per_char:g} UTF-8 bytes per character; a GPU sustains {a.gpu_tflops:g} TFLOP/s at "
                  f"{a.utilisation:.2f} utilisation (--gpu-tflops, --utilisation)")
