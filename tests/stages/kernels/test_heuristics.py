"""Heuristic scores and the keep decision: hand-computed values, a reference port, properties."""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.kernels.heuristics import (
    BULLETS,
    ELLIPSES,
    PUNCTUATION,
    RULE_TABLE,
    RULES,
    SCORE_NAMES,
    SCORER_VERSION,
    STOP_WORDS,
    TERMINAL_PUNCTUATION,
    decide,
    score_documents,
    score_text,
)
from stages.params import FilteredDocumentsParams

COUNTS = ("word_count", "stop_word_count", "lorem_ipsum", "curly_brackets")
UNBOUNDED = ("mean_word_length", "symbol_word_ratio")
FRACTIONS = tuple(name for name in SCORE_NAMES if name not in COUNTS + UNBOUNDED)
ALL_OFF: dict[str, Any] = dict.fromkeys(RULES)


def nonzero(text: str) -> dict[str, float]:
    return {name: value for name, value in score_text(text).items() if value != 0.0}


# --- hand-computed values ----------------------------------------------------------------------

QUALITY = "The quick, brown fox!\n• Jumps over 42 ...\n\nthe LAZY dog's #tag…\n  with  \t zeal and to-do"


def test_quality_scores_by_hand() -> None:
    # words: The quick, brown fox! • Jumps over 42 ... the LAZY dog's #tag… with zeal and to-do (17)
    # stripped lengths: 3 5 5 3 - 5 4 2 - 3 4 5 3 4 4 3 5 -> 58 over 15 non-empty
    # lines: "The quick, brown fox!", "• Jumps over 42 ...", "the LAZY dog's #tag…", "with ... to-do"
    assert len(QUALITY) == 88
    assert nonzero(QUALITY) == {
        "word_count": 17.0,
        "mean_word_length": 58 / 15,
        "symbol_word_ratio": 3 / 17,  # one '#', one '...', one '…'
        "bullet_lines_frac": 1 / 4,
        "ellipsis_lines_frac": 2 / 4,
        "alpha_words_frac": 14 / 17,  # not: '•', '42', '...'
        "stop_word_count": 3.0,  # the (The, the), with, and; distinct; 'to-do' is not 'to'
        "top_2gram_char_frac": 10 / 88,  # all n-grams unique: the first one, "The quick,"
        "top_3gram_char_frac": 16 / 88,  # "The quick, brown"
        "top_4gram_char_frac": 21 / 88,  # "The quick, brown fox!"
        "terminal_punct_lines_frac": 3 / 4,  # '!', '.', '…'
    }


REPEATED = "a b c\na b c\n\nd e\n\na b c\na b c"


def test_repetition_scores_by_hand() -> None:
    # lines: abc abc de abc abc -> 3 duplicates of 5 chars; paragraphs: "abc\nabc", "de", "abc\nabc"
    # words: a b c a b c d e a b c a b c
    assert len(REPEATED) == 29
    assert nonzero(REPEATED) == {
        "word_count": 14.0,
        "mean_word_length": 1.0,
        "alpha_words_frac": 1.0,
        "dup_line_frac": 3 / 5,
        "dup_para_frac": 1 / 3,
        "dup_line_char_frac": 15 / 29,
        "dup_para_char_frac": 11 / 29,
        "top_2gram_char_frac": 4 * 3 / 29,  # "a b" and "b c" both 4x; "a b" occurs first
        "top_3gram_char_frac": 4 * 5 / 29,  # "a b c" 4x
        "top_4gram_char_frac": 2 * 7 / 29,  # "a b c a", "b c a b", "c a b c" 2x each; first wins
        "dup_5gram_char_frac": 5 / 29,  # "a b c a b" at word 8 repeats word 0, then the scan ends
        "dup_6gram_char_frac": 6 / 29,  # "a b c a b c" at word 8
    }


def test_duplicate_ngram_scan_jumps_past_a_counted_ngram() -> None:
    text = " ".join(["a"] * 12)  # 23 chars
    scores = score_text(text)
    assert scores["dup_5gram_char_frac"] == 10 / 23  # hits at words 1 and 6, then 11 > 12 - 5
    assert scores["dup_6gram_char_frac"] == 6 / 23  # hit at word 1, then 7 > 12 - 6
    assert scores["dup_10gram_char_frac"] == 10 / 23
    # "a a" 11 times x 3 chars = 33 > 23: overlapping occurrences count a char twice; capped
    assert scores["top_2gram_char_frac"] == 1.0


def test_top_ngram_ties_go_to_the_first_occurring_ngram() -> None:
    assert score_text("aa b c aa b c")["top_2gram_char_frac"] == 2 * 4 / 13  # "aa b" before "b c"
    assert score_text("b c aa b c aa")["top_2gram_char_frac"] == 2 * 3 / 13  # "b c" before "c aa"


def test_documents_shorter_than_n_have_no_top_ngram() -> None:
    assert nonzero("one two") == {
        "word_count": 2.0,
        "mean_word_length": 3.0,
        "alpha_words_frac": 1.0,
        "top_2gram_char_frac": 1.0,  # the whole text is its one 2-gram
    }


def test_line_and_paragraph_details() -> None:
    # '\r\n' and trailing spaces do not hide a duplicate; a whitespace-only line breaks paragraphs
    assert score_text("x y.\r\nx y.  ")["dup_line_frac"] == 1 / 2
    assert score_text("x y.\r\nx y.  ")["terminal_punct_lines_frac"] == 1.0
    assert score_text("p one\n \t\np one")["dup_para_frac"] == 1 / 2
    assert score_text("p one\n \t\np one")["dup_para_char_frac"] == 5 / 14
    # blank lines are not lines, so never duplicates
    assert score_text("a\n\n\n\nb")["dup_line_frac"] == 0.0
    assert score_text("  * item\n● item two\n·x\nplain")["bullet_lines_frac"] == 3 / 4
    assert score_text("«quoted»\n¿qué?\n”end”")["terminal_punct_lines_frac"] == 2 / 3


def test_c4_counts() -> None:
    assert score_text("Lorem Ipsum dolor. LOREM IPSUM! lorem  ipsum")["lorem_ipsum"] == 2.0
    assert score_text("{a} {{b}}")["curly_brackets"] == 3.0
    assert score_text("#### .... …")["symbol_word_ratio"] == (4 + 1 + 1) / 3  # may exceed 1


@pytest.mark.parametrize("text", ["", "\n\n\n", "   \t \r\n ", "\x00"])
def test_degenerate_texts_have_finite_scores(text: str) -> None:
    scores = score_text(text)
    assert list(scores) == list(SCORE_NAMES)
    assert all(math.isfinite(v) for v in scores.values())
    if not text.strip():
        assert set(scores.values()) == {0.0}


def test_documents_of_a_batch_do_not_see_each_other() -> None:
    batch = score_documents(["a b c d e", "a b c d e", "x"])
    assert batch["dup_5gram_char_frac"].tolist() == [0.0, 0.0, 0.0]
    assert batch["top_2gram_char_frac"].tolist() == [3 / 9, 3 / 9, 0.0]


def test_score_documents_shapes_and_dtypes() -> None:
    out = score_documents(["some text", ""])
    assert tuple(out) == SCORE_NAMES
    assert all(a.dtype == np.float64 and a.shape == (2,) for a in out.values())
    assert all(a.shape == (0,) for a in score_documents([]).values())
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        score_documents(["ok", None])  # type: ignore[list-item]


# --- the rule table -----------------------------------------------------------------------------


def test_rule_table_matches_params_and_scores() -> None:
    # every field but the switches, the custom filters (tests/stages/test_custom_filters.py) and the datatrove
    # mode's own rules (tests/stages/kernels/test_heuristics_datatrove.py) is a threshold
    thresholds = [name for name in FilteredDocumentsParams.model_fields
                  if name not in ("enabled", "rules", "filters", *FilteredDocumentsParams.datatrove_only)]
    assert list(RULES) == thresholds  # params order is the reason order
    assert all(rule.score in SCORE_NAMES for rule in RULE_TABLE)
    assert all(rule.op == rule.name[:3] for rule in RULE_TABLE)
    assert isinstance(SCORER_VERSION, int)


def test_default_params_keep_a_good_document_and_drop_bad_ones() -> None:
    good = (
        "The river that runs through the old town has changed its course many times in a century.\n"
        "Farmers who worked the land near its banks learned to read the water and to plant with care.\n"
        "In dry years the fields turned brown, and families moved to the city to look for work.\n"
        "When the rains returned, the valley filled with green again and the markets were busy.\n"
        "Today a small museum tells this story with maps, letters and photographs from local homes.\n"
    )
    bad = ["Too short.", "Lorem ipsum " + good, "\n".join(["The same line is here with us."] * 20)]
    keep, reason, _ = decide(score_documents([good, *bad]), FilteredDocumentsParams())
    assert keep.tolist() == [True, False, False, False]
    assert reason.tolist() == [None, "min_words", "max_lorem_ipsum", "max_dup_line_frac"]


# --- decide ------------------------------------------------------------------------------------

SCORES = {
    "word_count": np.array([10.0, 100.0, 100.0, 100.0]),
    "dup_line_frac": np.array([0.5, 0.5, 0.1, 0.1]),
    "curly_brackets": np.array([3.0, 0.0, 3.0, 2.0]),
}
PARAMS = FilteredDocumentsParams(
    **ALL_OFF | {"min_words": 50, "max_dup_line_frac": 0.3, "max_curly_brackets": 2}
)


def test_decide_reason_is_the_first_failing_rule_in_rules_order() -> None:
    keep, reason, fails = decide(SCORES, PARAMS)
    assert keep.dtype == np.bool_ and reason.dtype == object
    assert keep.tolist() == [False, False, False, True]
    assert reason.tolist() == ["min_words", "max_dup_line_frac", "max_curly_brackets", None]
    assert fails == dict.fromkeys(RULES, 0) | {
        "min_words": 1,
        "max_dup_line_frac": 2,
        "max_curly_brackets": 2,  # a threshold itself passes: 2.0 is kept
    }


def test_decide_none_disables_a_rule() -> None:
    params = PARAMS.model_copy(update={"min_words": None})
    _, reason, fails = decide(SCORES, params)
    assert reason.tolist() == ["max_dup_line_frac", "max_dup_line_frac", "max_curly_brackets", None]
    assert fails["min_words"] == 0


def test_decide_disabled_stage_keeps_everything() -> None:
    keep, reason, fails = decide(SCORES, PARAMS.model_copy(update={"enabled": False}))
    assert keep.all() and set(reason.tolist()) == {None} and set(fails.values()) == {0}


def test_decide_needs_only_the_scores_of_active_rules() -> None:
    with pytest.raises(KeyError, match="word_count"):
        decide({"dup_line_frac": np.zeros(2)}, FilteredDocumentsParams(**ALL_OFF | {"min_words": 1}))
    keep, _, _ = decide({"dup_line_frac": np.zeros(2)}, FilteredDocumentsParams(**ALL_OFF))
    assert keep.tolist() == [True, True]
    with pytest.raises(ValueError, match="length"):
        decide({"word_count": np.zeros(2), "dup_line_frac": np.zeros(3)}, PARAMS)


# --- reference port and properties --------------------------------------------------------------


def reference_scores(text: str) -> dict[str, float]:
    """The module docstring's definitions, written the slow obvious way (datatrove's loops)."""

    def ratio(a: float, b: float) -> float:
        return a / b if b else 0.0

    def duplicates(items: list[str]) -> tuple[int, int]:
        seen: set[str] = set()
        n = chars = 0
        for item in items:
            if item in seen:
                n, chars = n + 1, chars + len(item)
            seen.add(item)
        return n, chars

    words = text.split()
    lines = [s.strip() for s in text.split("\n") if s.strip()]
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    stripped = [w.strip(PUNCTUATION) for w in words]
    out = {
        "word_count": len(words),
        "mean_word_length": ratio(sum(map(len, stripped)), sum(1 for s in stripped if s)),
        "symbol_word_ratio": ratio(text.count("#") + text.count("...") + text.count("…"), len(words)),
        "bullet_lines_frac": ratio(sum(s.startswith(BULLETS) for s in lines), len(lines)),
        "ellipsis_lines_frac": ratio(sum(s.endswith(ELLIPSES) for s in lines), len(lines)),
        "alpha_words_frac": ratio(sum(any(c.isalpha() for c in w) for w in words), len(words)),
        "stop_word_count": len({s.lower() for s in stripped} & STOP_WORDS),
        "dup_line_frac": ratio(duplicates(lines)[0], len(lines)),
        "dup_para_frac": ratio(duplicates(paras)[0], len(paras)),
        "dup_line_char_frac": ratio(duplicates(lines)[1], len(text)),
        "dup_para_char_frac": ratio(duplicates(paras)[1], len(text)),
        "terminal_punct_lines_frac": ratio(sum(s.endswith(TERMINAL_PUNCTUATION) for s in lines), len(lines)),
        "lorem_ipsum": text.lower().count("lorem ipsum"),
        "curly_brackets": text.count("{"),
    }
    for n in (2, 3, 4):
        grams = Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
        if grams:
            top, count = grams.most_common(1)[0]
            out[f"top_{n}gram_char_frac"] = min(len(" ".join(top)) * count / len(text), 1.0)
        else:
            out[f"top_{n}gram_char_frac"] = 0.0
    for n in range(5, 11):
        seen: set[tuple[str, ...]] = set()
        idx = repeated = 0
        while idx < len(words) - n + 1:
            gram = tuple(words[idx : idx + n])
            if gram in seen:
                repeated += sum(map(len, gram))
                idx += n
            else:
                seen.add(gram)
                idx += 1
        out[f"dup_{n}gram_char_frac"] = ratio(repeated, len(text))
    return {name: float(out[name]) for name in SCORE_NAMES}


# Few distinct tokens, so lines, paragraphs and n-grams repeat often.
TOKENS = ["a", "b", "c", "The", "the,", "to", "x.", "...", "…", "#", "•", "- ", "{", "lorem ipsum", "42"]
SEPARATORS = [" ", " ", " ", "\n", "\n\n", "\n \n", "\t", "\r\n", ""]
repetitive_text = st.lists(st.tuples(st.sampled_from(TOKENS), st.sampled_from(SEPARATORS)), max_size=80).map(
    lambda parts: "".join(token + sep for token, sep in parts)
)
any_text = st.one_of(st.text(), st.text(alphabet="ab \n\x00"), repetitive_text)


@settings(max_examples=300, deadline=None)
@given(repetitive_text)
def test_scores_equal_the_reference_port(text: str) -> None:
    assert score_text(text) == pytest.approx(reference_scores(text), rel=1e-12, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(any_text)
def test_scores_are_finite_and_fractions_are_fractions(text: str) -> None:
    scores = score_text(text)
    assert all(math.isfinite(v) and v >= 0.0 for v in scores.values())
    assert all(scores[name] <= 1.0 for name in FRACTIONS)
    assert all(scores[name] == int(scores[name]) for name in COUNTS)


@settings(max_examples=100, deadline=None)
@given(st.lists(any_text, max_size=8))
def test_score_documents_equals_score_text_per_document(texts: list[str]) -> None:
    batch = score_documents(texts)
    for i, text in enumerate(texts):
        assert {name: float(batch[name][i]) for name in SCORE_NAMES} == score_text(text)


def threshold_strategy(field: str) -> st.SearchStrategy[float]:
    """Integers for the integer thresholds (counts), floats around [0, 1] for the others."""
    if "int" in str(FilteredDocumentsParams.model_fields[field].annotation):
        return st.integers(0, 60).map(float)
    return st.floats(0.0, 1.2)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(repetitive_text, min_size=1, max_size=6),
    st.fixed_dictionaries({}, optional={r.name: threshold_strategy(r.name) for r in RULE_TABLE}),
)
def test_decide_is_consistent(texts: list[str], thresholds: dict[str, float]) -> None:
    params = FilteredDocumentsParams(**ALL_OFF | thresholds)
    keep, reason, fails = decide(score_documents(texts), params)
    assert keep.tolist() == [r is None for r in reason]
    assert sum(fails.values()) >= int((~keep).sum())
    for rule in RULES:
        assert fails[rule] >= sum(r == rule for r in reason)
        assert rule in thresholds or fails[rule] == 0
