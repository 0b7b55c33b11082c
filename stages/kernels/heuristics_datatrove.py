"""Heuristic scores with datatrove's semantics: ``FilteredDocumentsParams.rules = "datatrove"``.

The same thresholds as the default rules (``stages.kernels.heuristics``), measured the way
datatrove 0.10.1's ``GopherQualityFilter``, ``GopherRepetitionFilter``, ``FineWebQualityFilter``
and ``C4QualityFilter`` (document rules) measure them, so a FineWeb-style recipe carries over
(docs/quality.md). Rules run in that pipeline order and a document's reason is its first failing
rule; each reason is the threshold's field with a ``dt_`` prefix (``dt_min_words``), so the
ledger never mixes the two modes' counts.

Units:

- *words*: datatrove's ``split_into_words(text, "en")``: spaCy English tokens, stripped, blank
  ones dropped (``stages.kernels.spacy_words``, a port that needs no spaCy). Punctuation is its
  own token: ``"end."`` is two words.
- *symbol words*: words made only of ``PUNCTUATION`` (datatrove's ``PUNCTUATION_SET``: ASCII
  and CJK punctuation, control chars, ``TERMINAL_PUNCTUATION``).

=========================  ====================================================================
word_count                 words that are not symbol words (Gopher ``n_non_symbol_words``)
mean_word_length           mean ``len(w)`` (unstripped) over those words; NaN if there are none,
                           which no rule fails (datatrove's ``np.mean([])``)
hash_word_ratio            ``text.count("#")`` / words (all words, symbol words included)
ellipsis_word_ratio        (``text.count("...")`` + ``text.count("…")``) / words
bullet_lines_frac          ``text.splitlines()`` (blank lines counted) whose ``lstrip()`` starts
                           with ``•`` or ``-`` / lines
ellipsis_lines_frac        those lines whose ``rstrip()`` ends with ``...`` or ``…`` / lines
alpha_words_frac           words with an alphabetic char / words (punctuation tokens count)
stop_word_count            distinct words in ``STOP_WORDS``, case-sensitive: ``The`` is not one
dup_para_frac              paragraphs (``text.strip()`` split at ``\\n{2,}``, unstripped) equal to
                           an earlier one / paragraphs
dup_para_char_frac         their chars / ``len(text)``
dup_line_frac              lines (``text`` split at ``\\n+``, unstripped, a trailing "" included)
                           equal to an earlier one / lines
dup_line_char_frac         their chars / ``len(text)``
top_{n}gram_char_frac      as the default rules, over these words, not capped at 1.0
dup_{n}gram_char_frac      as the default rules, over these words
terminal_punct_lines_frac  non-blank ``text.split("\\n")`` lines, unstripped, ending with one of
                           datatrove's ``TERMINAL_PUNCTUATION`` (no quotes) / those lines
short_lines_frac           those lines of at most ``SHORT_LINE_CHARS`` chars / those lines
char_dup_frac              chars of those lines equal to an earlier one / ``len(text)`` without
                           its newlines (FineWeb ``char_duplicates_ratio``)
newline_word_ratio         ``text.count("\\n")`` / words (FineWeb ``new_line_ratio``)
lorem_ipsum                ``text.splitlines()`` lines containing "lorem ipsum", any case
curly_brackets             those lines containing ``{``
=========================  ====================================================================

Where datatrove divides by zero (no words, no lines) the score is 0.0 and the document is
judged; datatrove raises there, or removes it as "empty". Two deliberate differences, both of
them needed by this project's shape: the duplicated n-grams compare word tuples (datatrove
compares ``"".join(words)``, so ``("ab", "c")`` equals ``("a", "bc")`` there; no document of
the bench corpus differs by it), and C4's line filters (which rewrite the kept text: this stage
removes documents, it never edits them) are not run, so lorem ipsum and curly brackets are
looked for in every line, as datatrove's ``C4QualityFilter`` does with its line filters off.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import partial
from itertools import count

import numpy as np
import numpy.typing as npt

from stages.kernels import datatrove_rules
from stages.kernels import heuristics as H
from stages.kernels.spacy_words import words as split_words

Rule = H.Rule
FloatArray = H.FloatArray

STOP_WORDS: tuple[str, ...] = ("the", "be", "to", "of", "and", "that", "have", "with")
_STOP_BIT: dict[str, int] = {w: 1 << k for k, w in enumerate(STOP_WORDS)}
PUNCTUATION_SET: frozenset[str] = frozenset(datatrove_rules.PUNCTUATION) | frozenset(
    datatrove_rules.TERMINAL_PUNCTUATION
)
TERMINAL_PUNCTUATION: tuple[str, ...] = tuple(datatrove_rules.TERMINAL_PUNCTUATION)
SHORT_LINE_CHARS = 30  # FineWeb's short_line_length

def _rule(field: str, score: str, op: str, name: str = "") -> Rule:
    return Rule(f"dt_{name or field}", score, op, field)  # type: ignore[arg-type]


# datatrove's pipeline order: Gopher quality, Gopher repetition (paragraphs before lines), FineWeb, C4.
RULE_TABLE: tuple[Rule, ...] = (
    _rule("min_words", "word_count", "min"),
    _rule("max_words", "word_count", "max"),
    _rule("min_mean_word_length", "mean_word_length", "min"),
    _rule("max_mean_word_length", "mean_word_length", "max"),
    _rule("max_symbol_word_ratio", "hash_word_ratio", "max", "max_hash_word_ratio"),
    _rule("max_symbol_word_ratio", "ellipsis_word_ratio", "max", "max_ellipsis_word_ratio"),
    _rule("max_bullet_lines_frac", "bullet_lines_frac", "max"),
    _rule("max_ellipsis_lines_frac", "ellipsis_lines_frac", "max"),
    _rule("min_alpha_words_frac", "alpha_words_frac", "min"),
    _rule("min_stop_words", "stop_word_count", "min"),
    _rule("max_dup_para_frac", "dup_para_frac", "max"),
    _rule("max_dup_para_char_frac", "dup_para_char_frac", "max"),
    _rule("max_dup_line_frac", "dup_line_frac", "max"),
    _rule("max_dup_line_char_frac", "dup_line_char_frac", "max"),
    *(_rule(f"max_top_{n}gram_char_frac", f"top_{n}gram_char_frac", "max") for n in H.TOP_NGRAMS),
    *(_rule(f"max_dup_{n}gram_char_frac", f"dup_{n}gram_char_frac", "max") for n in H.DUP_NGRAMS),
    _rule("min_terminal_punct_lines_frac", "terminal_punct_lines_frac", "min"),
    _rule("max_short_lines_frac", "short_lines_frac", "max"),
    _rule("max_char_dup_frac", "char_dup_frac", "max"),
    _rule("max_newline_word_ratio", "newline_word_ratio", "max"),
    _rule("max_lorem_ipsum", "lorem_ipsum", "max"),
    _rule("max_curly_brackets", "curly_brackets", "max"),
)
RULES: tuple[str, ...] = tuple(rule.name for rule in RULE_TABLE)
# Every score is some rule's, in the order the rules first use them.
SCORE_NAMES: tuple[str, ...] = tuple(dict.fromkeys(rule.score for rule in RULE_TABLE))

_PARAGRAPH_BREAK = re.compile(r"\n{2,}")
_LINE_BREAK = re.compile(r"\n+")
_TEXT_SCORES: tuple[str, ...] = (
    "hash_word_ratio",  # raw counts here; divided by the word count later
    "ellipsis_word_ratio",
    "bullet_lines_frac",
    "ellipsis_lines_frac",
    "dup_para_frac",
    "dup_para_char_frac",
    "dup_line_frac",
    "dup_line_char_frac",
    "terminal_punct_lines_frac",
    "short_lines_frac",
    "char_dup_frac",
    "newline_word_ratio",  # raw newline count
    "lorem_ipsum",
    "curly_brackets",
)


def score_text(text: str) -> dict[str, float]:
    """Every score of ``SCORE_NAMES`` for one document (see the module docstring)."""
    return {name: float(values[0]) for name, values in score_documents([text]).items()}


def score_documents(texts: Sequence[str]) -> dict[str, FloatArray]:
    """Every score of ``SCORE_NAMES`` for a batch: name -> float64 (n,), row i for ``texts[i]``.

    As ``heuristics.score_documents``: line scores per document in Python, word statistics and
    n-gram repetition over the whole batch in numpy. Words are tokenized once per distinct
    whitespace-separated chunk of the batch.
    """
    n = len(texts)
    out = {name: np.zeros(n, dtype=np.float64) for name in SCORE_NAMES}
    if n == 0:
        return out
    memo: dict[str, list[str]] = {}
    batch = H.batch_words(texts, partial(split_words, memo=memo), _text_scores, _TEXT_SCORES)
    n_chars, n_words, id_count = batch.n_chars, batch.n_words, batch.id_count
    out.update(batch.text_scores)
    for name in ("hash_word_ratio", "ellipsis_word_ratio", "newline_word_ratio"):
        out[name] = H._ratio(out[name], n_words)

    attrs = _distinct_word_attrs(batch.distinct_words)
    doc = np.repeat(np.arange(n), batch.n_distinct)
    weights = id_count.astype(np.float64)

    def per_doc(attr: str) -> FloatArray:
        return H._sum_per_doc(doc, weights * attrs[attr], n)

    non_symbol = per_doc("non_symbol")
    out["word_count"] = non_symbol
    lengths = per_doc("non_symbol_length")
    out["mean_word_length"] = np.divide(lengths, non_symbol, out=np.full(n, np.nan), where=non_symbol != 0)
    out["alpha_words_frac"] = H._ratio(per_doc("has_alpha"), n_words)
    stop_words = np.zeros(n, np.float64)
    for bit in _STOP_BIT.values():
        stop_words += H._sum_per_doc(doc, ((attrs["stop_bits"] & bit) != 0).astype(np.int64), n) > 0
    out["stop_word_count"] = stop_words

    word_id = batch.word_id
    word_len = attrs["length"][word_id]
    top, dup = H._ngram_repetition(word_id, word_len, id_count[word_id] >= 2, n_words)
    for n_gram, chars in top.items():
        out[f"top_{n_gram}gram_char_frac"] = H._ratio(chars, n_chars)
    for n_gram, chars in dup.items():
        out[f"dup_{n_gram}gram_char_frac"] = H._ratio(chars, n_chars)
    return out


def exemptions(language: npt.NDArray[np.object_]) -> dict[str, npt.NDArray[np.bool_]]:
    """``heuristics.exemptions`` for this table: a rule is exempt where the default rule of the
    same threshold is (the word rules for languages written without spaces, the English
    stop-word rule for other known languages)."""
    base = H.exemptions(language)
    return {rule.name: base[rule.threshold_field] for rule in RULE_TABLE if rule.threshold_field in base}


def _distinct_word_attrs(distinct_words: list[str]) -> dict[str, H.IntArray]:
    """int64 columns per (document, distinct word): length, is not a symbol word, its length if
    not, has an alphabetic char, its stop-word bit (case-sensitive)."""
    vocab = dict(zip(dict.fromkeys(distinct_words), count()))
    words = list(vocab)
    size = len(words)
    punct = PUNCTUATION_SET
    non_symbol = np.fromiter((not punct.issuperset(w) for w in words), np.int64, size)
    length = np.fromiter(map(len, words), np.int64, size)
    has_alpha = [w.isalpha() or any(map(str.isalpha, w)) for w in words]
    columns = {
        "length": length,
        "non_symbol": non_symbol,
        "non_symbol_length": length * non_symbol,
        "has_alpha": np.fromiter(has_alpha, np.int64, size),
        "stop_bits": np.fromiter((_STOP_BIT.get(w, 0) for w in words), np.int64, size),
    }
    vocab_id = np.fromiter(map(vocab.__getitem__, distinct_words), np.int64, len(distinct_words))
    return {name: column[vocab_id] for name, column in columns.items()}


def _text_scores(text: str) -> tuple[float, ...]:
    """The ``_TEXT_SCORES`` of one document (the three word ratios not yet divided)."""
    n_chars = len(text)
    lines = text.splitlines()
    n_lines = len(lines)
    stripped_lower = [line.strip().lower() for line in lines]
    paragraphs = _PARAGRAPH_BREAK.split(text.strip())
    dup_paras, dup_para_chars = H._duplicates(paragraphs)
    split_lines = _LINE_BREAK.split(text)
    dup_lines, dup_line_chars = H._duplicates(split_lines)
    fw_lines = [line for line in text.split("\n") if line.strip() != ""]
    n_fw = len(fw_lines)
    no_newlines = n_chars - text.count("\n")
    return (
        text.count("#"),
        text.count("...") + text.count("…"),
        sum(s.lstrip().startswith(("•", "-")) for s in lines) / n_lines if n_lines else 0.0,
        sum(s.rstrip().endswith(("...", "…")) for s in lines) / n_lines if n_lines else 0.0,
        dup_paras / len(paragraphs),
        dup_para_chars / n_chars if n_chars else 0.0,
        dup_lines / len(split_lines),
        dup_line_chars / n_chars if n_chars else 0.0,
        sum(line.endswith(TERMINAL_PUNCTUATION) for line in fw_lines) / n_fw if n_fw else 0.0,
        sum(len(line) <= SHORT_LINE_CHARS for line in fw_lines) / n_fw if n_fw else 0.0,
        H._duplicates(fw_lines)[1] / no_newlines if no_newlines else 0.0,
        text.count("\n"),
        sum("lorem ipsum" in s for s in stripped_lower),
        sum("{" in line for line in lines),
    )
