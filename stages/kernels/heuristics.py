"""Heuristic document scores (Gopher quality and repetition, C4/FineWeb lines) and the keep decision.

Scoring and deciding are separate so that scores are computed once per scorer version and any
set of thresholds can be applied to them later (``filtered_documents`` re-keys on thresholds,
``heuristic_scores`` only on ``SCORER_VERSION``).

Units, shared by every score of one document:

- *words*: ``text.split()`` (runs of Unicode whitespace separate words; Gopher does the same).
- *lines*: ``text.split("\\n")``, each stripped of surrounding whitespace; blank lines are dropped.
- *paragraphs*: the text split at blank lines (a newline, optional whitespace, a newline), each
  stripped; blank paragraphs are dropped.
- *chars*: ``len(text)`` of the raw text; it is the denominator of every ``*_char_frac``.
- ``strip(w)``: ``w`` without leading/trailing characters of ``PUNCTUATION``.

Scores (a ratio whose denominator is 0 is 0.0, so every score is finite):

=========================  ====================================================================
word_count                 number of words
mean_word_length           mean ``len(strip(w))`` over words with a non-empty ``strip(w)``
symbol_word_ratio          (count of ``#`` + count of ``...`` + count of ``…``) / words;
                           counts are non-overlapping ``str.count``; may exceed 1
bullet_lines_frac          lines starting with one of ``BULLETS`` / lines
ellipsis_lines_frac        lines ending with ``...`` or ``…`` / lines
alpha_words_frac           words containing an alphabetic char (``str.isalpha``) / words
stop_word_count            distinct ``strip(w).lower()`` in ``STOP_WORDS`` ("at least two of the
                           following English words", Gopher; datatrove counts distinct too)
dup_line_frac              lines equal to an earlier line / lines
dup_para_frac              paragraphs equal to an earlier paragraph / paragraphs
dup_line_char_frac         chars of the lines counted by dup_line_frac / chars
dup_para_char_frac         chars of the paragraphs counted by dup_para_frac / chars
top_{n}gram_char_frac      n = 2, 3, 4: (count x length) of the most frequent word n-gram / chars,
                           length = its words joined by one space; ties go to the n-gram that
                           occurs first; a document with fewer than n words scores 0.0; capped at
                           1.0 (overlapping occurrences, as in "a a a a", can count a char twice)
dup_{n}gram_char_frac      n = 5..10: chars of words (spaces not counted) in duplicated n-grams /
                           chars, scanning left to right: an n-gram seen before at a scanned
                           position is counted and the scan jumps past it, otherwise it is
                           remembered and the scan moves one word on
terminal_punct_lines_frac  lines ending with one of ``TERMINAL_PUNCTUATION`` / lines
lorem_ipsum                count of "lorem ipsum" in ``text.lower()``
curly_brackets             count of ``{``
=========================  ====================================================================

The repetition scores follow datatrove's ``GopherRepetitionFilter`` (``find_duplicates``,
``find_top_duplicate``, ``find_all_duplicate``) with three deliberate differences: lines and
paragraphs are compared stripped and blank ones are ignored, so trailing whitespace or ``\\r``
does not hide a duplicate and blank lines never count as duplicates; n-grams are compared as
word tuples (datatrove compares ``"".join(words)``, so ``("ab", "c")`` equals ``("a", "bc")``);
the top n-gram fraction is capped at 1.0.
"""

from __future__ import annotations

import re
import string
from array import array
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import count
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from stages import versions
from stages.kernels.language import NO_SPACE_LANGUAGES
from stages.params import FilteredDocumentsParams

SCORER_VERSION: int = versions.HEURISTIC_SCORER  # bumped in stages/versions.py, which keys the outputs

STOP_WORDS: frozenset[str] = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
# Bit k of a word's stop-word mask: it is the k-th of the sorted STOP_WORDS (distinct counting).
_STOP_BIT: dict[str, int] = {w: 1 << k for k, w in enumerate(sorted(STOP_WORDS))}
BULLETS: tuple[str, ...] = ("•", "●", "○", "▪", "‣", "-", "*", "·")
ELLIPSES: tuple[str, ...] = ("...", "…")
TERMINAL_PUNCTUATION: tuple[str, ...] = tuple(".!?\"'…。．！？‼⁇⁈⁉”’＂＇")
# A fixed string, not Unicode categories: the categories change with Python's Unicode version,
# and a score must not change without a SCORER_VERSION bump.
PUNCTUATION: str = (
    string.punctuation + "¡¿«»‹›‘’‚‛“”„‟‐‑‒–—―…·•′″、。，．！？：；（）［］｛｝【】《》〈〉「」『』〔〕"
)

TOP_NGRAMS: tuple[int, ...] = (2, 3, 4)
DUP_NGRAMS: tuple[int, ...] = (5, 6, 7, 8, 9, 10)

SCORE_NAMES: tuple[str, ...] = (
    "word_count",
    "mean_word_length",
    "symbol_word_ratio",
    "bullet_lines_frac",
    "ellipsis_lines_frac",
    "alpha_words_frac",
    "stop_word_count",
    "dup_line_frac",
    "dup_para_frac",
    "dup_line_char_frac",
    "dup_para_char_frac",
    *(f"top_{n}gram_char_frac" for n in TOP_NGRAMS),
    *(f"dup_{n}gram_char_frac" for n in DUP_NGRAMS),
    "terminal_punct_lines_frac",
    "lorem_ipsum",
    "curly_brackets",
)


class Rule(NamedTuple):
    """One threshold rule: ``name`` (the ledger's reason) is also the ``FilteredDocumentsParams``
    field holding the threshold unless ``field`` names another; ``op`` "min" fails a document
    whose score is below it, "max" one above it."""

    name: str
    score: str
    op: Literal["min", "max"]
    field: str = ""

    @property
    def threshold_field(self) -> str:
        return self.field or self.name


# The rules as data, in the order that picks a document's reason (its first failing rule).
RULE_TABLE: tuple[Rule, ...] = (
    Rule("min_words", "word_count", "min"),
    Rule("max_words", "word_count", "max"),
    Rule("min_mean_word_length", "mean_word_length", "min"),
    Rule("max_mean_word_length", "mean_word_length", "max"),
    Rule("max_symbol_word_ratio", "symbol_word_ratio", "max"),
    Rule("max_bullet_lines_frac", "bullet_lines_frac", "max"),
    Rule("max_ellipsis_lines_frac", "ellipsis_lines_frac", "max"),
    Rule("min_alpha_words_frac", "alpha_words_frac", "min"),
    Rule("min_stop_words", "stop_word_count", "min"),
    Rule("max_dup_line_frac", "dup_line_frac", "max"),
    Rule("max_dup_para_frac", "dup_para_frac", "max"),
    Rule("max_dup_line_char_frac", "dup_line_char_frac", "max"),
    Rule("max_dup_para_char_frac", "dup_para_char_frac", "max"),
    *(Rule(f"max_top_{n}gram_char_frac", f"top_{n}gram_char_frac", "max") for n in TOP_NGRAMS),
    *(Rule(f"max_dup_{n}gram_char_frac", f"dup_{n}gram_char_frac", "max") for n in DUP_NGRAMS),
    Rule("min_terminal_punct_lines_frac", "terminal_punct_lines_frac", "min"),
    Rule("max_lorem_ipsum", "lorem_ipsum", "max"),
    Rule("max_curly_brackets", "curly_brackets", "max"),
)
RULES: tuple[str, ...] = tuple(rule.name for rule in RULE_TABLE)
# Rules that count whitespace-split words: meaningless where words are not separated by spaces
# (Chinese, Japanese, Thai: a "word" there is a phrase or a line), so off for those languages.
WORD_RULES: tuple[str, ...] = (
    "min_words", "max_words", "min_mean_word_length", "max_mean_word_length", "max_symbol_word_ratio",
    "min_alpha_words_frac", "min_stop_words",
)
# STOP_WORDS are English: the rule that counts them applies to English documents only.
STOP_WORD_RULES: tuple[str, ...] = ("min_stop_words",)

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
# Per-document scores computed in plain Python, in this column order.
_TEXT_SCORES: tuple[str, ...] = (
    "symbol_word_ratio",  # raw symbol count here; divided by the word count later
    "bullet_lines_frac",
    "ellipsis_lines_frac",
    "terminal_punct_lines_frac",
    "dup_line_frac",
    "dup_line_char_frac",
    "dup_para_frac",
    "dup_para_char_frac",
    "lorem_ipsum",
    "curly_brackets",
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def score_text(text: str) -> dict[str, float]:
    """Every score of ``SCORE_NAMES`` for one document (see the module docstring)."""
    return {name: float(values[0]) for name, values in score_documents([text]).items()}


def score_documents(texts: Sequence[str]) -> dict[str, FloatArray]:
    """Every score of ``SCORE_NAMES`` for a batch: name -> float64 (n,), row i for ``texts[i]``.

    Line and paragraph scores are per-document Python; word statistics and n-gram repetition
    are computed over the whole batch at once (numpy over the concatenated words), so the
    per-word Python work is one split, one Counter and one id lookup.
    """
    n = len(texts)
    out = {name: np.zeros(n, dtype=np.float64) for name in SCORE_NAMES}
    if n == 0:
        return out
    batch = batch_words(texts, str.split, _text_scores, _TEXT_SCORES)
    n_chars, n_words, n_distinct, id_count = batch.n_chars, batch.n_words, batch.n_distinct, batch.id_count
    out.update(batch.text_scores)
    out["symbol_word_ratio"] = _ratio(out["symbol_word_ratio"], n_words)
    out["word_count"] = n_words.astype(np.float64)

    attrs = _distinct_word_attrs(batch.distinct_words)
    out.update(_word_scores(attrs, id_count, n_distinct, n_words))

    # Word ids unique across the batch, so n-grams of different documents never compare equal.
    word_id = batch.word_id
    word_len = attrs["length"][word_id]
    top, dup = _ngram_repetition(word_id, word_len, id_count[word_id] >= 2, n_words)
    for n_gram, chars in top.items():
        out[f"top_{n_gram}gram_char_frac"] = np.minimum(_ratio(chars, n_chars), 1.0)
    for n_gram, chars in dup.items():
        out[f"dup_{n_gram}gram_char_frac"] = _ratio(chars, n_chars)
    return out


class BatchWords(NamedTuple):
    """The words of a batch of documents, as ``batch_words`` collects them."""

    n_chars: FloatArray  # (n,) len(text)
    n_words: IntArray  # (n,)
    n_distinct: IntArray  # (n,) distinct words per document
    text_scores: dict[str, FloatArray]  # the per-document scores of ``text_scores``
    distinct_words: list[str]  # (D,) each document's distinct words in first-seen order, grouped by document
    id_count: IntArray  # (D,) occurrences of each
    word_id: IntArray  # (T,) every word as an index into distinct_words (so distinct across documents)


def batch_words(
    texts: Sequence[str], split: Callable[[str], list[str]], text_scores: Callable[[str], tuple[float, ...]],
    names: Sequence[str],
) -> BatchWords:
    """Split every text into words once (``split``) and compute its per-document ``text_scores``
    (named ``names``): the per-word Python work is one split, one Counter and one id lookup."""
    n = len(texts)
    n_chars = np.zeros(n, dtype=np.float64)
    n_words = np.zeros(n, dtype=np.int64)
    n_distinct = np.zeros(n, dtype=np.int64)
    scores = np.zeros((n, len(names)), dtype=np.float64)
    # Typed arrays, not lists: 8 bytes per word instead of a pointer plus an int object.
    local_ids = array("q")  # per word: index of the word among its document's distinct words
    distinct_words: list[str] = []
    distinct_counts = array("q")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] is {type(text).__name__}, expected str")
        words = split(text)
        counts = Counter(words)
        local = dict(zip(counts, count()))
        local_ids.extend(map(local.__getitem__, words))
        distinct_words.extend(counts)
        distinct_counts.extend(counts.values())
        n_chars[i] = len(text)
        n_words[i] = len(words)
        n_distinct[i] = len(counts)
        scores[i] = text_scores(text)
    word_id = np.frombuffer(local_ids, dtype=np.int64) + np.repeat(np.cumsum(n_distinct) - n_distinct, n_words)
    return BatchWords(
        n_chars, n_words, n_distinct, {name: np.ascontiguousarray(scores[:, k]) for k, name in enumerate(names)},
        distinct_words, np.frombuffer(distinct_counts, dtype=np.int64), word_id,
    )


def decide(
    scores: Mapping[str, npt.NDArray[np.floating]],
    params: FilteredDocumentsParams,
    exempt: Mapping[str, npt.NDArray[np.bool_]] | None = None,
    rules: Sequence[Rule] = RULE_TABLE,
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.object_], dict[str, int]]:
    """Apply the thresholds of ``params`` to stored scores.

    Returns ``keep`` bool (n,); ``reason`` object (n,), the name of the first failing rule in
    ``RULES`` order or None for a kept document; ``fails_per_rule`` {rule: documents failing it}
    over every rule of ``rules`` (``RULE_TABLE``, or another mode's table; a document may fail
    several). A rule whose threshold is None never fails (nor does a NaN score);
    with ``params.enabled`` False no rule does. Only the scores of active rules are required.
    ``exempt`` maps a rule name to bool (n,): the documents that rule does not judge (see
    ``exemptions``).
    """
    active = [
        (rule, threshold)
        for rule in rules
        if params.enabled and (threshold := getattr(params, rule.threshold_field)) is not None
    ]
    lengths = {len(values) for values in scores.values()}
    if len(lengths) > 1:
        raise ValueError(f"score arrays differ in length: {sorted(lengths)}")
    missing = sorted({rule.score for rule, _ in active} - set(scores))
    if missing:
        raise KeyError(f"scores missing for active rules: {missing}")
    n = lengths.pop() if lengths else 0
    keep = np.ones(n, dtype=bool)
    reason = np.full(n, None, dtype=object)
    fails_per_rule = dict.fromkeys((rule.name for rule in rules), 0)
    for rule, threshold in active:
        values = np.asarray(scores[rule.score], dtype=np.float64)
        fails = values < threshold if rule.op == "min" else values > threshold
        if exempt is not None and rule.name in exempt:
            fails &= ~np.asarray(exempt[rule.name], dtype=bool)
        fails_per_rule[rule.name] = int(fails.sum())
        reason[fails & keep] = rule.name  # only documents not already failed by an earlier rule
        keep &= ~fails
    return keep, reason, fails_per_rule


def exemptions(language: npt.NDArray[np.object_]) -> dict[str, npt.NDArray[np.bool_]]:
    """{rule: bool (n,)} of the documents each rule does not judge, from their languages (object
    (n,) of ISO 639 codes; None, "" or "und" where unknown, which every rule judges): the
    ``WORD_RULES`` skip languages written without spaces, ``STOP_WORD_RULES`` every known
    language but English."""
    codes = np.array(["" if c is None else str(c) for c in language], dtype=object)
    known = ~np.isin(codes, ["", "und"])
    no_space = np.isin(codes, sorted(NO_SPACE_LANGUAGES))
    out = {rule: no_space for rule in WORD_RULES}
    for rule in STOP_WORD_RULES:
        out[rule] = no_space | (known & (codes != "en"))
    return out


def _ratio(num: npt.NDArray[np.floating] | IntArray, den: npt.NDArray[np.floating] | IntArray) -> FloatArray:
    """num / den elementwise as float64, 0.0 where den is 0."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros_like(num), where=den != 0)


def _sum_per_doc(doc: IntArray, values: npt.NDArray[np.floating] | IntArray, n_docs: int) -> FloatArray:
    """float64 (n_docs,): the sum of ``values`` per document index ``doc``."""
    return np.bincount(doc, weights=values, minlength=n_docs).astype(np.float64, copy=False)


def _distinct_word_attrs(distinct_words: list[str]) -> dict[str, IntArray]:
    """``_word_attrs`` of each (document, distinct word), computed once per distinct batch word."""
    vocab = dict(zip(dict.fromkeys(distinct_words), count()))
    vocab_id = np.fromiter(map(vocab.__getitem__, distinct_words), np.int64, len(distinct_words))
    return {name: column[vocab_id] for name, column in _word_attrs(list(vocab)).items()}


def _word_scores(
    attrs: Mapping[str, IntArray], id_count: IntArray, n_distinct: IntArray, n_words: IntArray
) -> dict[str, FloatArray]:
    """mean_word_length, alpha_words_frac, stop_word_count: float64 (n,) each.

    ``attrs`` and ``id_count`` (D,) are per (document, distinct word), grouped by document;
    ``n_distinct`` and ``n_words`` (n,) are per document.
    """
    n = len(n_words)
    doc = np.repeat(np.arange(n), n_distinct)
    weights = id_count.astype(np.float64)

    def per_doc(attr: str) -> FloatArray:
        return _sum_per_doc(doc, weights * attrs[attr], n)

    # Distinct stop words: "The" and "the," are different distinct words of one stop word, so
    # the documents' masks are OR-ed per stop word rather than counted.
    stop_words = np.zeros(n, np.float64)
    for bit in _STOP_BIT.values():
        stop_words += _sum_per_doc(doc, ((attrs["stop_bits"] & bit) != 0).astype(np.int64), n) > 0
    return {
        "mean_word_length": _ratio(per_doc("stripped_length"), per_doc("stripped_nonempty")),
        "alpha_words_frac": _ratio(per_doc("has_alpha"), n_words),
        "stop_word_count": stop_words,
    }


def _word_attrs(words: list[str]) -> dict[str, IntArray]:
    """int64 (len(words),) columns: length, stripped length, has an alphabetic char, stop-word bit.

    Column-wise with C-level ``map`` rather than a call per word: this runs once per distinct word.
    """
    size = len(words)
    stripped = [w.strip(PUNCTUATION) for w in words]
    stripped_length = np.fromiter(map(len, stripped), np.int64, size)
    # isalpha() first: the common all-letter word skips the per-char scan.
    has_alpha = [w.isalpha() or any(map(str.isalpha, w)) for w in words]
    return {
        "length": np.fromiter(map(len, words), np.int64, size),
        "stripped_length": stripped_length,
        "stripped_nonempty": (stripped_length > 0).astype(np.int64),
        "has_alpha": np.fromiter(has_alpha, np.int64, size),
        "stop_bits": np.fromiter((_STOP_BIT.get(w, 0) for w in map(str.lower, stripped)), np.int64, size),
    }


def _text_scores(text: str) -> tuple[float, ...]:
    """The ``_TEXT_SCORES`` of one document (symbol count not yet divided by words)."""
    lines = [s for s in map(str.strip, text.split("\n")) if s]
    paragraphs = [s for s in map(str.strip, _PARAGRAPH_BREAK.split(text)) if s]
    n_lines = len(lines)
    dup_lines, dup_line_chars = _duplicates(lines)
    dup_paras, dup_para_chars = _duplicates(paragraphs)
    n_chars = len(text)
    symbols = text.count("#") + text.count("...") + text.count("…")
    return (
        symbols,
        sum(s.startswith(BULLETS) for s in lines) / n_lines if n_lines else 0.0,
        sum(s.endswith(ELLIPSES) for s in lines) / n_lines if n_lines else 0.0,
        sum(s.endswith(TERMINAL_PUNCTUATION) for s in lines) / n_lines if n_lines else 0.0,
        dup_lines / n_lines if n_lines else 0.0,
        dup_line_chars / n_chars if n_chars else 0.0,
        dup_paras / len(paragraphs) if paragraphs else 0.0,
        dup_para_chars / n_chars if n_chars else 0.0,
        text.lower().count("lorem ipsum"),
        text.count("{"),
    )


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(items equal to an earlier item, their total length), as datatrove's find_duplicates."""
    distinct = dict.fromkeys(items)
    return len(items) - len(distinct), sum(map(len, items)) - sum(map(len, distinct))


def _ngram_repetition(
    word_id: IntArray, word_len: IntArray, repeated: npt.NDArray[np.bool_], n_words: IntArray
) -> tuple[dict[int, FloatArray], dict[int, FloatArray]]:
    """Chars of the top n-gram (n in TOP_NGRAMS) and of duplicated n-grams (n in DUP_NGRAMS).

    ``word_id`` int64 (T,) is the concatenated words of all documents as ids that are distinct
    across documents, ``word_len`` int64 (T,) their lengths, ``repeated`` bool (T,) whether the
    word occurs twice or more in its document, ``n_words`` int64 (n,) words per document.
    Returns ({n: float64 (n,)}, {n: float64 (n,)}) of char counts, not yet divided by len(text).

    An n-gram can only repeat where its (n-1)-gram prefix and suffix both repeat, so each level
    ids only those candidate positions; in natural text they shrink fast and the work with them.
    """
    n_docs = len(n_words)
    total = len(word_id)
    starts = np.cumsum(n_words) - n_words
    doc_of = np.repeat(np.arange(n_docs), n_words)
    remaining = np.repeat(starts + n_words, n_words) - np.arange(total)  # words left in the doc
    cum_len = np.concatenate(([0], np.cumsum(word_len)))
    # Keys pair an (n-1)-gram id with a word id: injective as long as the factor exceeds every word id.
    factor = int(word_id.max()) + 1 if total else 1
    top: dict[int, FloatArray] = {}
    dup: dict[int, FloatArray] = {}
    ids, rep = word_id, repeated  # level n-1: an id per position (valid where rep), repeats?
    for n_gram in range(2, max(DUP_NGRAMS) + 1):
        m = max(total - n_gram + 1, 0)  # positions with n words left in the batch
        candidates = np.flatnonzero(rep[:m] & rep[1 : m + 1] & (remaining[:m] >= n_gram))
        # Keys stay below total**2, far from int64 overflow for any batch that fits in memory.
        keys = ids[candidates] * factor + word_id[candidates + n_gram - 1]
        _, first, inverse, group_count = np.unique(
            keys, return_index=True, return_inverse=True, return_counts=True
        )
        inverse = inverse.reshape(-1)
        is_rep = group_count[inverse] >= 2
        chars = cum_len[n_gram:] - cum_len[:-n_gram] if total >= n_gram else np.zeros(0, np.int64)
        if n_gram in TOP_NGRAMS:
            top[n_gram] = _top_chars(candidates[first], group_count, chars, starts, n_words, doc_of, n_gram)
        if n_gram in DUP_NGRAMS:
            hits = _duplicate_scan(candidates[is_rep], inverse[is_rep], n_gram)
            dup[n_gram] = _sum_per_doc(doc_of[hits], chars[hits], n_docs)
        ids = np.zeros(m, dtype=np.int64)
        ids[candidates] = inverse
        rep = np.zeros(m, dtype=bool)
        rep[candidates] = is_rep
    return top, dup


def _top_chars(
    group_pos: IntArray,
    group_count: IntArray,
    chars: IntArray,
    starts: IntArray,
    n_words: IntArray,
    doc_of: IntArray,
    n_gram: int,
) -> FloatArray:
    """Per document: count x (chars + spaces) of its most frequent n-gram, earliest on ties.

    ``group_pos``/``group_count`` (g,): first position and count of each candidate n-gram.
    Documents without a repeated n-gram take their first n-gram (count 1), as Counter does.
    """
    has_ngram = n_words >= n_gram
    out = np.zeros(len(n_words), dtype=np.float64)
    out[has_ngram] = chars[starts[has_ngram]] + (n_gram - 1)
    keep = group_count >= 2
    pos, cnt = group_pos[keep], group_count[keep]
    if len(pos):
        doc = doc_of[pos]
        order = np.lexsort((pos, -cnt, doc))  # per doc: highest count first, then earliest
        head = np.ones(len(order), dtype=bool)
        head[1:] = doc[order][1:] != doc[order][:-1]
        best = order[head]
        out[doc[best]] = cnt[best] * (chars[pos[best]] + (n_gram - 1))
    return out


def _duplicate_scan(positions: IntArray, ids: IntArray, n_gram: int) -> IntArray:
    """Positions that datatrove's find_all_duplicate counts, given only the repeated n-grams.

    ``positions`` (k,) ascending, ``ids`` (k,) their n-gram ids (distinct across documents).
    N-grams that occur once can never be "seen before", so skipping them does not change the
    scan; and a jump never crosses into the next document because an n-gram ends inside its own.
    """
    seen: set[int] = set()
    hits: list[int] = []
    resume = 0
    for pos, ngram in zip(positions.tolist(), ids.tolist(), strict=True):
        if pos < resume:
            continue
        if ngram in seen:
            hits.append(pos)
            resume = pos + n_gram
        else:
            seen.add(ngram)
    return np.asarray(hits, dtype=np.int64)
