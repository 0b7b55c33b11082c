"""Heuristic filters: this project against datatrove's Gopher filters on the same documents, same run.

Corpus: ``curate sample`` real text (stdlib docstrings, license files, package descriptions of
this Python installation; ``scraps`` left out), optionally with ``--copies`` of every document
(each with a distinct trailing line), as bench/fuzzy.py builds it.

Contenders, on the default ``FilteredDocumentsParams`` thresholds:

- ``ours kernel``: ``stages.kernels.heuristics.score_documents`` on chunks of about
  ``CHUNK_CHARS`` characters (as the program cuts them) + ``decide``, in this process, one core.
- ``ours program``: the real ``filtered_documents`` stage program through
  ``stages.execute.execute_crawl`` (stage ``heuristic`` only), timed like bench/fuzzy.py times
  ours: the seconds of its partitions (read raw Parquet, score on 2 worker processes, write the
  score cache and the decisions); ingestion is timed separately and not counted. Its removed
  count must equal the kernel's.
- ``ours datatrove mode``: the same with ``FilteredDocumentsParams(rules="datatrove")``:
  ``stages.kernels.heuristics_datatrove.score_documents`` (datatrove's semantics and spaCy's
  English words, ported; no spaCy) + ``decide`` on its rule table, in this process, one core,
  and as the real program (2 workers). Its decisions should equal datatrove's.
- ``datatrove``: ``GopherQualityFilter`` -> ``GopherRepetitionFilter`` -> ``FineWebQualityFilter``
  (its ``line_punct_thr`` is our ``min_terminal_punct_lines_frac``, its other rules our
  ``max_short_lines_frac``, ``max_char_dup_frac``, ``max_newline_word_ratio``, None by default,
  given as thresholds that never fail) -> ``C4QualityFilter`` (only ``filter_lorem_ipsum``, our
  ``max_lorem_ipsum = 0``; every line rule off: C4's terminal-punctuation rule drops *lines*, not
  documents, and is not ours), thresholds taken from ``FilteredDocumentsParams``. The filters run
  **in this process** on a list of datatrove ``Document`` objects, no executor: each document
  goes through them in that order (our ``RULE_TABLE`` order) until one rejects it, as in a
  datatrove pipeline, so the time is the filters' own (spaCy tokenization included; the
  tokenizer is loaded before the clock starts). One core.

Printed: docs/s and MB/s for each and the ratio; the decision-agreement table (both keep, both
remove, only ours removes, only datatrove removes); per rule, how many documents each side removed
with it as the first failing rule and how many both removed with that same rule; the most common
(ours, datatrove) reason pairs among disagreements; the same comparison with datatrove's filters
given ``text.split()`` words instead of spaCy tokens (untimed, to attribute the disagreements); a
few disagreeing documents; then the datatrove mode's speed, its decision agreement with datatrove
and how often both name the same first failing rule (``--fineweb``: with FineWeb's other rules on,
in both).

Where the two disagree, and why (our definitions: ``stages/kernels/heuristics.py``; we keep them,
this bench only measures them):

- Words (the documented "whitespace-split words"): ours are ``text.split()``; datatrove's are
  spaCy ``en`` tokens, which split punctuation, contractions and hyphens off words. This is most
  of the disagreement: datatrove's alpha-words rule divides by every token, punctuation tokens
  included, so prose with commas and periods, and docstrings and license text with ``(c)``,
  ``--``, ``foo.bar()``, fall under its 0.8; more, shorter tokens also move the word count, the
  mean word length and the n-gram rules. With ``text.split()`` words patched in, agreement goes
  from about 0.73 to about 0.98 on the sample corpus.
- The other two documented repetition differences: lines and paragraphs are compared stripped
  with blank ones dropped (datatrove splits lines at ``\n+`` unstripped and paragraphs at
  ``\n{2,}``, so ``"x"`` vs ``"x "`` or a whitespace-only line between paragraphs changes its
  counts; it also checks paragraphs before lines, so a document failing both is named by the
  paragraph rule there); n-grams are word tuples (datatrove joins words without a separator
  for the 5..10-gram rule). The top n-gram cap at 1.0 never matters at these thresholds.
- Not in the kernel's documented list (it compares only the repetition scores with datatrove),
  found by this bench in the quality rules and the line rule: datatrove's word count leaves out
  punctuation-only tokens (``>>>``, ``=``, ``--``), ours counts every word; its mean word length
  is over those tokens unstripped, ours strips ``PUNCTUATION`` from each word (ours is shorter);
  both stop-word rules count *distinct* stop words (Gopher: "at least two of the following
  English words"), datatrove's case-sensitive and unstripped, ours of ``strip(w).lower()``
  (ours counted occurrences before ``SCORER_VERSION`` 2); its symbol rule checks ``#`` and
  ellipses separately, ours sums them; its bullets are only ``•`` and ``-`` and its bullet and
  ellipsis line ratios count blank lines in the denominator (``splitlines()``), ours drops blank
  lines and also has ``●○▪‣*·``; its terminal-punctuation lines are not stripped (a trailing
  space fails the line) and its set lacks ``"``, ``'`` and ``…`` (ours has them, as C4's
  END_PUNCTUATION has the quotes).

    python bench/heuristics.py [--copies 1] [--max-docs 1500] [--examples 4] [--fineweb]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from common import SKIPPED_SOURCES, sample_texts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from curation_dagster.tools.sample import build_sample
from stages.kernels import heuristics as H
from stages.kernels import heuristics_datatrove as D
from stages.params import ExecutionParams, FilteredDocumentsParams
from stages.programs.filtered_documents import CHUNK_CHARS

# datatrove's rejection reasons -> our rule names (the same rule where both have it).
DT_RULE: dict[str, str] = {
    "gopher_short_doc": "min_words",
    "gopher_long_doc": "max_words",
    "gopher_below_avg_threshold": "min_mean_word_length",
    "gopher_above_avg_threshold": "max_mean_word_length",
    "gopher_too_many_hashes": "max_symbol_word_ratio",
    "gopher_too_many_ellipsis": "max_symbol_word_ratio",
    "gopher_too_many_bullets": "max_bullet_lines_frac",
    "gopher_too_many_end_ellipsis": "max_ellipsis_lines_frac",
    "gopher_below_alpha_threshold": "min_alpha_words_frac",
    "gopher_enough_stop_words": "min_stop_words",
    "dup_line_frac": "max_dup_line_frac",
    "dup_para_frac": "max_dup_para_frac",
    "dup_line_char_frac": "max_dup_line_char_frac",
    "dup_para_char_frac": "max_dup_para_char_frac",
    **{f"top_{n}_gram": f"max_top_{n}gram_char_frac" for n in H.TOP_NGRAMS},
    **{f"duplicated_{n}_n_grams": f"max_dup_{n}gram_char_frac" for n in H.DUP_NGRAMS},
    "line_punct_ratio": "min_terminal_punct_lines_frac",
    "lorem_ipsum": "max_lorem_ipsum",
    "curly_bracket": "max_curly_brackets",
}


# datatrove's rejection reasons -> the datatrove mode's rule names.
DT_MODE_RULE: dict[str, str] = {
    **{reason: f"dt_{rule}" for reason, rule in DT_RULE.items()},
    "gopher_too_many_hashes": "dt_max_hash_word_ratio",
    "gopher_too_many_ellipsis": "dt_max_ellipsis_word_ratio",
    "short_line_ratio": "dt_max_short_lines_frac",
    "char_dup_ratio": "dt_max_char_dup_frac",
    "list_ratio": "dt_max_newline_word_ratio",
}


def _chunks(texts: list[str]) -> Iterator[list[str]]:
    """Runs of about CHUNK_CHARS characters, as filtered_documents hands them to the kernel."""
    start = size = 0
    for i, text in enumerate(texts):
        size += len(text)
        if size >= CHUNK_CHARS:
            yield texts[start : i + 1]
            start, size = i + 1, 0
    if start < len(texts):
        yield texts[start:]


def run_ours_kernel(texts: list[str], params: FilteredDocumentsParams) -> dict[str, Any]:
    kernel = D if params.rules == "datatrove" else H
    t0 = time.perf_counter()
    parts = [kernel.score_documents(chunk) for chunk in _chunks(texts)]
    scores = {name: np.concatenate([p[name] for p in parts]) for name in kernel.SCORE_NAMES}
    keep, reason, _ = H.decide(scores, params, rules=kernel.RULE_TABLE)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "keep": keep, "reason": reason, "scores": scores}


def run_ours_program(corpus: Path, work: Path, params: FilteredDocumentsParams) -> dict[str, Any]:
    from stages.execute import execute_crawl
    from stages.spec import CrawlSpec
    from stages.store import Store

    sources = {p.name: {"url": str(p), "id_field": "id"} for p in sorted(corpus.iterdir())
               if p.is_dir() and p.name not in SKIPPED_SOURCES}
    spec = CrawlSpec(crawl="bench", sources=sources, stages=("heuristic",),
                     params={"filtered_documents": params.canonical()})
    outcomes = execute_crawl(Store(str(work / "data")), spec, ExecutionParams())
    reports = [o.manifest.report for (name, _), o in outcomes.items() if name == "filtered_documents"]
    per_reason: Counter[str] = Counter()
    for r in reports:
        per_reason.update(r["removed_per_reason"])
    return {
        "seconds": sum(o.seconds for (name, _), o in outcomes.items() if name == "filtered_documents"),
        "ingest_seconds": sum(o.seconds for (name, _), o in outcomes.items() if name == "raw_documents"),
        "docs": sum(r["input"] for r in reports),
        "removed": sum(r["removed"] for r in reports),
        "removed_per_reason": per_reason,
    }


def datatrove_filters(params: FilteredDocumentsParams) -> list[Any]:
    """datatrove's filters set to our thresholds, in our RULE_TABLE order (see the docstring)."""
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    p = params
    filters: list[Any] = [
        GopherQualityFilter(
            min_doc_words=p.min_words, max_doc_words=p.max_words,
            min_avg_word_length=p.min_mean_word_length, max_avg_word_length=p.max_mean_word_length,
            max_symbol_word_ratio=p.max_symbol_word_ratio, max_bullet_lines_ratio=p.max_bullet_lines_frac,
            max_ellipsis_lines_ratio=p.max_ellipsis_lines_frac, max_non_alpha_words_ratio=p.min_alpha_words_frac,
            min_stop_words=p.min_stop_words,
        ),
        GopherRepetitionFilter(
            dup_line_frac=p.max_dup_line_frac, dup_para_frac=p.max_dup_para_frac,
            dup_line_char_frac=p.max_dup_line_char_frac, dup_para_char_frac=p.max_dup_para_char_frac,
            top_n_grams=tuple((n, getattr(p, f"max_top_{n}gram_char_frac")) for n in H.TOP_NGRAMS),
            dup_n_grams=tuple((n, getattr(p, f"max_dup_{n}gram_char_frac")) for n in H.DUP_NGRAMS),
        ),
    ]
    if p.min_terminal_punct_lines_frac is not None:
        # Only the line-punctuation rule: the others compare a ratio <= 1 against inf.
        filters.append(FineWebQualityFilter(
            line_punct_thr=p.min_terminal_punct_lines_frac,
            short_line_thr=math.inf if p.max_short_lines_frac is None else p.max_short_lines_frac,
            char_duplicates_ratio=math.inf if p.max_char_dup_frac is None else p.max_char_dup_frac,
            new_line_ratio=math.inf if p.max_newline_word_ratio is None else p.max_newline_word_ratio,
        ))
    lorem, curly = p.max_lorem_ipsum == 0, p.max_curly_brackets == 0  # C4 can only say "none allowed"
    if lorem or curly:
        # Last: on a kept document C4QualityFilter rewrites doc.text (its kept lines, stripped).
        filters.append(C4QualityFilter(
            remove_citations=False, filter_no_terminal_punct=False, min_num_sentences=-1, min_words_per_line=-1,
            max_word_length=-1, filter_lorem_ipsum=lorem, filter_javascript=False, filter_curly_bracket=curly,
            filter_policy=False,
        ))
    return filters


def run_datatrove(texts: list[str], params: FilteredDocumentsParams) -> dict[str, Any]:
    from datatrove.data import Document
    from datatrove.pipeline.filters.base_filter import get_filter_result
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    filters = datatrove_filters(params)
    load_word_tokenizer("en").word_tokenize("Load spaCy before the clock starts.")
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    reasons: list[str | None] = []
    t0 = time.perf_counter()
    for doc in docs:
        reason = None
        for f in filters:
            kept, why = get_filter_result(f.filter(doc))
            if not kept:
                reason = why or f.name
                break
        reasons.append(reason)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "keep": np.array([r is None for r in reasons]), "reason": reasons}


def run_datatrove_whitespace_words(texts: list[str], params: FilteredDocumentsParams) -> dict[str, Any]:
    """The same filters with ``text.split()`` words instead of spaCy tokens (attribution only, untimed).

    What still disagrees then is not the tokenizer: the other differences in the docstring.
    """
    from unittest import mock

    from datatrove.pipeline.filters import fineweb_quality_filter, gopher_quality_filter, gopher_repetition_filter

    def split(text: str, language: str = "en") -> list[str]:
        return text.split()

    with contextlib.ExitStack() as stack:
        for module in (gopher_quality_filter, gopher_repetition_filter, fineweb_quality_filter):
            stack.enter_context(mock.patch.object(module, "split_into_words", split))
        return run_datatrove(texts, params)


def _preview(text: str) -> str:
    return json.dumps(text[:80], ensure_ascii=False)


def _pairs(title: str, ours_rule: list[str | None], dt_rule: list[str | None], top: int = 10) -> None:
    pairs = Counter((a or "keep", b or "keep") for a, b in zip(ours_rule, dt_rule, strict=True) if a != b)
    print(f"\n{title}")
    for (a, b), c in pairs.most_common(top):
        print(f"  {c:>6}  ours {a:<30} datatrove {b}")


def report(texts: list[str], ours: dict[str, Any], program: dict[str, Any], dt: dict[str, Any],
           dt_ws: dict[str, Any], params: FilteredDocumentsParams, examples: int) -> None:
    n = len(texts)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    rows = [("ours kernel (1 core)", ours["seconds"], int((~ours["keep"]).sum())),
            ("ours program (2 workers)", program["seconds"], program["removed"]),
            ("datatrove (1 core)", dt["seconds"], int((~dt["keep"]).sum()))]
    print(f"{n} documents, {mb:.2f} MB; ingestion for the program {program['ingest_seconds']:.2f} s (not counted)")
    print(f"{'contender':<26} {'seconds':>8} {'docs/s':>8} {'MB/s':>7} {'removed':>8}")
    for name, sec, removed in rows:
        print(f"{name:<26} {sec:>8.2f} {n / sec:>8.0f} {mb / sec:>7.2f} {removed:>8}")
    print(f"ours kernel vs datatrove: {dt['seconds'] / ours['seconds']:.1f}x faster (same core, same documents); "
          f"program vs datatrove: {dt['seconds'] / program['seconds']:.1f}x")
    ours_reasons = Counter(r for r in ours["reason"].tolist() if r)
    if program["docs"] != n or Counter(program["removed_per_reason"]) != ours_reasons:
        print(f"WARNING: the program ({program['docs']} docs, {dict(program['removed_per_reason'])}) and the "
              f"kernel ({n} docs, {dict(ours_reasons)}) disagree")

    ok, dk = ours["keep"], dt["keep"]
    print("\ndecision agreement           documents")
    for label, mask in (("both keep", ok & dk), ("both remove", ~ok & ~dk),
                        ("only ours removes", ~ok & dk), ("only datatrove removes", ok & ~dk)):
        print(f"  {label:<26} {int(mask.sum()):>9}")
    print(f"  agreement                  {float((ok == dk).mean()):>9.3f}")

    ours_rule = [r if r else None for r in ours["reason"].tolist()]
    dt_rule = [DT_RULE.get(r, r) if r else None for r in dt["reason"]]
    ours_count = Counter(r for r in ours_rule if r)
    dt_count = Counter(r for r in dt_rule if r)
    both = Counter(a for a, b in zip(ours_rule, dt_rule, strict=True) if a and a == b)
    print(f"\n{'first failing rule':<32} {'ours':>6} {'datatrove':>10} {'both (same doc)':>16}")
    for rule in [*H.RULES, *sorted(set(dt_count) - set(H.RULES))]:
        if ours_count[rule] or dt_count[rule]:
            print(f"  {rule:<30} {ours_count[rule]:>6} {dt_count[rule]:>10} {both[rule]:>16}")

    _pairs("most common differing (ours, datatrove) first rules", ours_rule, dt_rule)
    wk = dt_ws["keep"]
    print(f"\ndatatrove on text.split() words instead of spaCy tokens (untimed): agreement "
          f"{float((ok == wk).mean()):.3f}, only ours removes {int((~ok & wk).sum())}, "
          f"only datatrove removes {int((ok & ~wk).sum())}")
    _pairs("what still differs: (ours, datatrove) first rules",
           ours_rule, [DT_RULE.get(r, r) if r else None for r in dt_ws["reason"]])

    thresholds = {rule.name: (rule.score, getattr(params, rule.name)) for rule in H.RULE_TABLE}
    for label, mask in (("only ours removes", ~ok & dk), ("only datatrove removes", ok & ~dk)):
        print(f"\n{label} (first {examples}):")
        for i in np.flatnonzero(mask)[:examples].tolist():
            if ours_rule[i]:
                score, limit = thresholds[ours_rule[i]]
                why = f"ours {ours_rule[i]} ({score} = {ours['scores'][score][i]:.3g}, limit {limit})"
            else:
                why = "ours keeps"
            print(f"  {_preview(texts[i])}\n      {why}; datatrove {dt['reason'][i] or 'keeps'}")


def report_datatrove_mode(texts: list[str], mode: dict[str, Any], program: dict[str, Any], dt: dict[str, Any],
                          examples: int) -> None:
    """Our datatrove mode against datatrove: speed, decision agreement, same first failing rule."""
    n = len(texts)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    print("\n== ours, rules: datatrove ==")
    print(f"{'contender':<34} {'seconds':>8} {'docs/s':>8} {'MB/s':>7} {'removed':>8}")
    for name, sec, removed in (("ours datatrove mode kernel (1 core)", mode["seconds"], int((~mode["keep"]).sum())),
                               ("ours datatrove mode program (2 w.)", program["seconds"], program["removed"]),
                               ("datatrove (1 core)", dt["seconds"], int((~dt["keep"]).sum()))):
        print(f"{name:<34} {sec:>8.2f} {n / sec:>8.0f} {mb / sec:>7.2f} {removed:>8}")
    print(f"datatrove mode kernel vs datatrove: {dt['seconds'] / mode['seconds']:.1f}x faster")
    mk, dk = mode["keep"], dt["keep"]
    ours_rule = [r if r else None for r in mode["reason"].tolist()]
    dt_rule = [DT_MODE_RULE.get(r, r) if r else None for r in dt["reason"]]
    same_rule = sum(a == b for a, b in zip(ours_rule, dt_rule, strict=True))
    print(f"decision agreement with datatrove: {float((mk == dk).mean()):.4f} (both keep {int((mk & dk).sum())}, "
          f"both remove {int((~mk & ~dk).sum())}, only ours removes {int((~mk & dk).sum())}, "
          f"only datatrove removes {int((mk & ~dk).sum())}); same first failing rule: {same_rule / n:.4f}")
    _pairs("datatrove mode: differing (ours, datatrove) first rules", ours_rule, dt_rule)
    for i in np.flatnonzero(mk != dk)[:examples].tolist():
        print(f"  {_preview(texts[i])}\n      ours {ours_rule[i] or 'keeps'}; datatrove {dt['reason'][i] or 'keeps'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=1)
    ap.add_argument("--max-docs", type=int, default=1500, help="per source")
    ap.add_argument("--examples", type=int, default=4, help="disagreeing documents shown per direction")
    ap.add_argument("--fineweb", action="store_true",
                    help="also FineWeb's short-line, char-duplicate and list rules (0.67, 0.01, 0.3), "
                         "in the datatrove mode and in datatrove")
    args = ap.parse_args()
    fineweb = {"max_short_lines_frac": 0.67, "max_char_dup_frac": 0.01, "max_newline_word_ratio": 0.3}
    params = FilteredDocumentsParams()
    dt_params = FilteredDocumentsParams(rules="datatrove", **(fineweb if args.fineweb else {}))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_sample(root / "corpus", max_docs_per_source=args.max_docs, copies=args.copies)
        texts = list(sample_texts(root / "corpus"))
        # The programs first: their worker processes fork from a process without spaCy loaded.
        program = run_ours_program(root / "corpus", root / "work", params)
        dt_program = run_ours_program(root / "corpus", root / "work", dt_params)
    ours = run_ours_kernel(texts, params)
    mode = run_ours_kernel(texts, dt_params)
    dt = run_datatrove(texts, dt_params)
    dt_ws = run_datatrove_whitespace_words(texts, dt_params)
    report(texts, ours, program, dt, dt_ws, params, args.examples)
    report_datatrove_mode(texts, mode, dt_program, dt, args.examples)


if __name__ == "__main__":
    main()
