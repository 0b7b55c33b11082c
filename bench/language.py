"""Language identification on real multilingual text: whole-page fastText against our prose vote.

Corpus: ``bench/language_corpus.py`` (manual pages, gettext catalogs, ``pydoc`` pages and Debian
changelogs installed on this machine; English technical pages full of options, commands and code,
and the same kinds of pages in 30-odd other languages), written once to ``--corpus`` (default: a
folder in the system's temp dir). Translated manual pages of which more than 20 % of the text is
still the English original (``english_frac``; Debian ships several such half-translated pages)
are left out of the accuracy figures: their "language" is not the folder's; they are counted
separately (``mixed``).

Held out: every page is on the ``dev`` or the ``test`` side by a hash of its document's name (all
translations of one page on one side). The identifier's rules were tuned by looking at ``dev``
only; the figures to quote are ``test``'s.

Contenders, each deciding ``languages: [en]`` (keep a page when it is English):

- ``whole``: fastText lid.176 (the same packaged ``lid.176.ftz``) on the whole page, newlines as
  spaces, top-1 label, no threshold.
- ``whole@0.65``: the same with FineWeb's / datatrove's default threshold 0.65.
- ``datatrove``: datatrove's own ``LanguageFilter(languages=["en"])`` (threshold 0.65, its
  ``FT176LID`` predicting k=-1) when datatrove is installed (``pip install
  'curation-dagster[bench]'``); its model is the same ``lid.176.ftz`` injected into it, because
  its default downloads ``lid.176.bin`` at run time (no network here).
- ``ours``: ``stages.kernels.language.identify`` (prose blocks, letter-weighted vote) and
  ``decide`` with ``DocumentLanguagesParams``' default ``min_score``.

Two page lengths: ``full`` pages (up to 12,000 characters) and ``short`` windows (about 400
characters of consecutive lines from a seeded random place of each page: a short web page, or a
page that is mostly code). Printed per split and length: English kept and other-language removed
per origin and per language, overall; ours' exact-label accuracy; docs/s.

    python bench/language.py [--corpus PATH] [--split test|dev|all] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from language_corpus import build, load

from stages.kernels import language as L
from stages.params import DocumentLanguagesParams, language_model_path
from stages.programs.document_languages import FastTextIdentifier

MIXED = 0.2  # a translated page with more of its English original than this is "mixed"
SHORT_CHARS = 400

Decider = Callable[[list[str]], np.ndarray]  # texts -> keep bool (n,) for languages: [en]


def window(page: dict[str, Any], size: int = SHORT_CHARS) -> str:
    lines = page["text"].split("\n")
    start = random.Random(page["id"]).randrange(len(lines))
    out: list[str] = []
    n = 0
    for line in lines[start:] + lines[:start]:
        out.append(line)
        n += len(line) + 1
        if n >= size:
            break
    return "\n".join(out)


def contenders(ident: FastTextIdentifier) -> dict[str, Decider]:
    min_score = DocumentLanguagesParams.model_fields["min_score"].default

    def whole(threshold: float) -> Decider:
        def decide(texts: list[str]) -> np.ndarray:
            labels, probs = ident([" ".join(t.split()) for t in texts])
            return np.array([ls[0] == "en" and float(p[0]) >= threshold for ls, p in zip(labels, probs, strict=True)])
        return decide

    def ours(texts: list[str]) -> np.ndarray:
        language, score, _ = L.identify(texts, ident)
        return L.decide(language, score, ("en",), min_score)[0]

    out: dict[str, Decider] = {"whole": whole(0.0), "whole@0.65": whole(0.65)}
    dt = _datatrove(ident)
    if dt is not None:
        out["datatrove"] = dt
    out["ours"] = ours
    return out


def _datatrove(ident: FastTextIdentifier) -> Decider | None:
    try:
        from datatrove.data import Document
        from datatrove.pipeline.filters import LanguageFilter
    except ImportError:
        print("datatrove not installed: its column is left out (pip install 'curation-dagster[bench]')")
        return None
    from unittest import mock

    # datatrove asks for the fasttext-numpy2-wheel distribution by name; fasttext-community's
    # module has the same API, so its dependency check is skipped while the filter is built.
    with mock.patch("datatrove.pipeline.base.check_required_dependencies"):
        filt = LanguageFilter(languages=["en"])
    filt.model._model = ident.model  # the packaged lid.176.ftz; its default downloads lid.176.bin

    def decide(texts: list[str]) -> np.ndarray:
        return np.array([bool(filt.filter(Document(text=t, id=str(i)))) for i, t in enumerate(texts)])

    return decide


def evaluate(pages: Sequence[dict[str, Any]], texts: list[str], deciders: dict[str, Decider],
             ident: FastTextIdentifier) -> dict[str, Any]:
    english = np.array([p["lang"] == "en" for p in pages])
    result: dict[str, Any] = {"pages": len(pages), "english": int(english.sum()), "methods": {}}
    for name, decide in deciders.items():
        t0 = time.perf_counter()
        keep = decide(texts)
        seconds = time.perf_counter() - t0
        correct = np.where(english, keep, ~keep)
        per_lang: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        per_origin: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for p, ok in zip(pages, correct.tolist(), strict=True):
            origin = ("en/" if p["lang"] == "en" else "other/") + p["origin"]
            for table, key in ((per_lang, p["lang"]), (per_origin, origin)):
                table[key][0] += ok
                table[key][1] += 1
        result["methods"][name] = {
            "english_kept": float(correct[english].mean()) if english.any() else None,
            "other_removed": float(correct[~english].mean()) if (~english).any() else None,
            "docs_per_s": round(len(texts) / seconds, 1) if seconds else None,
            "per_language": {k: v for k, v in sorted(per_lang.items())},
            "per_origin": {k: v for k, v in sorted(per_origin.items())},
        }
    language, _, _ = L.identify(texts, ident)
    label = np.array([p["lang"] for p in pages], dtype=object)
    result["ours_exact_label"] = float((language == label).mean())
    return result


def show(title: str, res: dict[str, Any]) -> None:
    methods = list(res["methods"])
    print(f"\n## {title}: {res['pages']} pages ({res['english']} English)")
    print("| | " + " | ".join(methods) + " |")
    print("|---|" + "---|" * len(methods))
    for key, label in (("english_kept", "English kept"), ("other_removed", "other languages removed")):
        print(f"| {label} | " + " | ".join(f"{res['methods'][m][key]:.3f}" for m in methods) + " |")
    print("| docs/s | " + " | ".join(str(res["methods"][m]["docs_per_s"]) for m in methods) + " |")
    for group in ("per_origin", "per_language"):
        keys = list(res["methods"][methods[0]][group])
        for k in keys:
            cells = []
            for m in methods:
                ok, n = res["methods"][m][group][k]
                cells.append(f"{ok / n:.3f}")
            n = res["methods"][methods[0]][group][k][1]
            print(f"| {k} ({n}) | " + " | ".join(cells) + " |")
    print(f"ours, exact label (the page's language, not only en / other): {res['ours_exact_label']:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = Path(tempfile.gettempdir()) / "curation-language-bench" / "pages.jsonl"
    ap.add_argument("--corpus", type=Path, default=default, help="corpus JSONL (built there if missing)")
    ap.add_argument("--split", choices=("test", "dev", "all"), default="test")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    pages = load(build(args.corpus))
    print(f"corpus: {len(pages)} pages ({time.perf_counter() - t0:.0f} s to build or read)")
    mixed = [p for p in pages if p.get("english_frac", 0.0) > MIXED]
    pages = [p for p in pages if p.get("english_frac", 0.0) <= MIXED]
    if args.split != "all":
        pages = [p for p in pages if p["split"] == args.split]
        mixed = [p for p in mixed if p["split"] == args.split]
    ident = FastTextIdentifier(language_model_path("lid.176.ftz"))
    deciders = contenders(ident)
    out: dict[str, Any] = {"split": args.split}
    for length in ("full", "short"):
        texts = [p["text"] if length == "full" else window(p) for p in pages]
        out[length] = evaluate(pages, texts, deciders, ident)
        show(f"{args.split} split, {length} pages", out[length])
    # ours at other thresholds: the trade between English kept (full and short) and the rest.
    english = np.array([p["lang"] == "en" for p in pages])
    sweep: dict[str, Any] = {}
    for length in ("full", "short"):
        texts = [p["text"] if length == "full" else window(p) for p in pages]
        language, score, _ = L.identify(texts, ident)
        sweep[length] = (language, score)
    mixed_id = L.identify([p["text"] for p in mixed], ident) if mixed else None
    print("\nours, min_score sweep (English kept full / short, other removed full / short, mixed kept as English):")
    out["sweep"] = {}
    for t in (0.0, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8):
        row = []
        for length in ("full", "short"):
            keep = L.decide(*sweep[length], ("en",), t)[0]
            row += [float(keep[english].mean()), float((~keep[~english]).mean())]
        mk = float(L.decide(mixed_id[0], mixed_id[1], ("en",), t)[0].mean()) if mixed_id else float("nan")
        out["sweep"][t] = [*row, mk]
        print(f"  {t:.2f}: {row[0]:.3f} / {row[2]:.3f}, {row[1]:.4f} / {row[3]:.4f}, {mk:.2f}")
    if mixed:  # half-translated pages: how each contender calls them (no right answer)
        calls = {name: float(np.mean(d([p["text"] for p in mixed]))) for name, d in deciders.items()}
        out["mixed"] = {"pages": len(mixed), "called_english": calls}
        print(f"\nmixed pages (translated, > {MIXED:.0%} still English): {len(mixed)}; share kept as English: "
              + ", ".join(f"{k} {v:.2f}" for k, v in calls.items()))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
