"""The datatrove heuristics mode (``rules: datatrove``): hand-computed values where datatrove's
semantics differ from the default rules, the spaCy word port, and agreement with datatrove's own
decisions on the sample corpus (a checked-in golden file, so datatrove need not be installed)."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from stages.kernels import datatrove_rules
from stages.kernels import heuristics as H
from stages.kernels import heuristics_datatrove as D
from stages.kernels.spacy_words import _INFIX, _SUFFIX, _SUFFIX_RE, words
from stages.params import FilteredDocumentsParams, params_key
from stages.store import Store
from tests.stages.kernels.test_heuristics import repetitive_text
from tests.support.tiny_corpus import read, run_all, spec

DT = FilteredDocumentsParams(rules="datatrove")


def dt_scores(text: str) -> dict[str, float]:
    return D.score_text(text)


# --- words: spaCy's English tokens, stripped ---------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("Don't stop, U.S. friends: e.g. well-known (c) foo.bar() :) ... end.",
     ["Do", "n't", "stop", ",", "U.S.", "friends", ":", "e.g.", "well", "-", "known", "(", "c", ")",
      "foo.bar", "(", ")", ":)", "...", "end", "."]),
    ("See https://example.com/a?b=1, or 10km; it's 5$ -- ok!!",
     ["See", "https://example.com/a?b=1", ",", "or", "10", "km", ";", "it", "'s", "5", "$", "--", "ok", "!", "!"]),
    ('a--b x/y "quoted" C++ #tag >>> x = 1',
     ["a", "--", "b", "x", "/", "y", '"', "quoted", '"', "C++", "#", "tag", ">", ">", ">", "x", "=", "1"]),
    ("  \n\t ", []),
])
def test_words_are_spacy_english_tokens(text: str, expected: list[str]) -> None:
    assert words(text) == expected


def test_the_mode_needs_neither_spacy_nor_datatrove() -> None:
    code = ("import sys, stages.kernels.heuristics_datatrove as D; D.score_text('Hello, world.'); "
            "sys.exit(any(m.split('.')[0] in ('spacy', 'datatrove', 'thinc') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_words_agree_with_spacy_when_installed() -> None:
    spacy = pytest.importorskip("spacy")
    nlp = spacy.blank("en")
    texts = ["(a.m.) 'tis y'all can't... U.K.'s 3.5% +1 -2 ~3 [1] {x} <b>bold</b> x@y.org www.a.co/b",
             "Hello\u00a0world\u2014dash “quote” ‘single’ «guillemets» ½ 10°C. 5'11\" a/b/c ../x ...wait"]
    for text in texts:
        assert words(text) == [t.text.strip() for t in nlp(text) if t.text.strip()]


def test_no_infix_splits_letters_and_digits() -> None:
    # spacy_words keeps an alphanumeric chunk whole without running the infix pattern: check
    # every alphanumeric code point, between letters, digits and itself
    alnum = [chr(i) for i in range(sys.maxunicode + 1) if chr(i).isalnum()]
    assert not any(_INFIX("".join(f"a{c}a0{c}0A{c}A{c}{c}" for c in alnum)))


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from("aZ09.,'s$%)km…!-_°C"), max_size=12) | st.text(max_size=8))
def test_suffix_search_of_the_tail_equals_the_full_search(text: str) -> None:
    full = _SUFFIX_RE.search(text)
    tail = _SUFFIX(text)
    assert (full and full.span()) == (tail and tail.span())


def _fuzz_texts(n: int, seed: int) -> list[str]:
    """Random strings of special cases, URLs, contractions and punctuation runs: the tokenizer's corners."""
    rnd = random.Random(seed)
    chars = [*"aAbZ09.,;:!?'\"()[]{}<>-–—_/\\@#$%^&*+=~`|…’“”«»°€£¥", " ", " ", " ", "\n"]
    specials = sorted(datatrove_rules.SPECIAL_CASES)
    pieces = ["http://a.com/x", "www.b.org", "e.g.", "U.S.", "10km", "3.5%", "a-b", "don't", "1st", "5'11\"", ":)"]
    texts = []
    for _ in range(n):
        parts = []
        for _ in range(rnd.randint(1, 8)):
            r = rnd.random()
            parts.append(rnd.choice(specials) if r < 0.3 else rnd.choice(pieces) if r < 0.5
                         else "".join(rnd.choice(chars) for _ in range(rnd.randint(1, 6))))
        texts.append("".join(p if rnd.random() < 0.5 else p + " " for p in parts))
    return texts


def test_words_agree_with_spacy_on_random_corner_cases_when_installed() -> None:
    spacy = pytest.importorskip("spacy")
    nlp = spacy.blank("en")
    for text in _fuzz_texts(3000, seed=7):
        assert words(text) == [t.text.strip() for t in nlp(text) if t.text.strip()], repr(text)


def test_special_case_runs_across_a_space_block_but_are_not_merged() -> None:
    assert words(":)") == [":)"]
    assert words("=) :)") == ["=)", ":)"]
    assert words("x=) :)3") == ["x=", ")", ":", ")", "3"]  # ") :" spells "):", which blocks ":)"
    assert words("°c.") == ["°", "c", "."]  # a special case's own tokens are not merged again


# --- scores where datatrove's semantics differ -------------------------------------------------

def test_word_count_leaves_out_punctuation_tokens_and_alpha_ratio_counts_them() -> None:
    text = "Hello , world -- again >>> = ok."
    # tokens: Hello , world -- again > > > = ok .  (11); symbol-only: , -- > > > = .  (7)
    s = dt_scores(text)
    assert s["word_count"] == 4.0  # default rules: 8 whitespace words
    assert s["mean_word_length"] == (5 + 5 + 5 + 2) / 4
    assert s["alpha_words_frac"] == 4 / 11
    assert H.score_text(text)["word_count"] == 8.0
    assert H.score_text(text)["alpha_words_frac"] == 4 / 8  # Hello world again ok.


def test_alpha_ratio_divides_by_punctuation_tokens() -> None:
    assert dt_scores("Hello, world.")["alpha_words_frac"] == 2 / 4
    assert H.score_text("Hello, world.")["alpha_words_frac"] == 1.0


def test_mean_word_length_is_unstripped_and_nan_without_words() -> None:
    assert dt_scores("(hello) world's")["mean_word_length"] == (5 + 5 + 2) / 3  # ( ) are tokens of their own
    assert math.isnan(dt_scores("... !!! --")["mean_word_length"])
    keep, _, _ = H.decide({"mean_word_length": np.array([math.nan])},
                          FilteredDocumentsParams(rules="datatrove", **{r.threshold_field: None for r in D.RULE_TABLE
                                                                         if r.score != "mean_word_length"}),
                          rules=D.RULE_TABLE)
    assert keep.tolist() == [True]  # datatrove: np.mean([]) is NaN, and NaN < 3 is False


def test_stop_words_are_case_sensitive() -> None:
    assert dt_scores("The cat and The dog")["stop_word_count"] == 1.0  # "The" is not "the"
    assert dt_scores("the cat and the dog")["stop_word_count"] == 2.0
    assert dt_scores("the, and. of")["stop_word_count"] == 3.0  # punctuation is split off
    assert H.score_text("The cat and The dog")["stop_word_count"] == 2.0


def test_bullets_are_two_marks_and_blank_lines_count() -> None:
    text = "• one\n\n* two\n- three\n  - four"
    assert dt_scores(text)["bullet_lines_frac"] == 3 / 5  # '*' is no bullet; the blank line counts
    assert H.score_text(text)["bullet_lines_frac"] == 4 / 4


def test_ellipsis_lines_count_blank_lines() -> None:
    text = "wait...\nmore… \n\nno"
    assert dt_scores(text)["ellipsis_lines_frac"] == 2 / 4
    assert H.score_text(text)["ellipsis_lines_frac"] == 2 / 3


def test_hash_and_ellipsis_are_separate_ratios_over_all_tokens() -> None:
    s = dt_scores("#a b ... c")  # tokens: # a b ... c
    assert (s["hash_word_ratio"], s["ellipsis_word_ratio"]) == (1 / 5, 1 / 5)
    assert H.score_text("#a b ... c")["symbol_word_ratio"] == 2 / 4


def test_terminal_punctuation_lines_are_unstripped_and_quotes_do_not_end_them() -> None:
    text = 'He said "hi."\nShe said "bye"\nend. \n\nok!'
    assert dt_scores(text)["terminal_punct_lines_frac"] == 1 / 4  # only "ok!": '"' and ' ' end the others
    assert H.score_text(text)["terminal_punct_lines_frac"] == 4 / 4


def test_lines_and_paragraphs_are_compared_unstripped() -> None:
    text = "a\nb \na\nb\n"  # lines split at \n+: a, "b ", a, b, "" -> one duplicate
    s = dt_scores(text)
    assert (s["dup_line_frac"], s["dup_line_char_frac"]) == (1 / 5, 1 / 9)
    assert H.score_text(text)["dup_line_frac"] == 2 / 4
    s = dt_scores("p\n\nq\n\n\np")  # paragraphs: p, q, p
    assert (s["dup_para_frac"], s["dup_para_char_frac"]) == (1 / 3, 1 / 8)


def test_fineweb_line_scores() -> None:
    text = "short\n" + "x" * 31 + "\nshort\n\n"
    s = dt_scores(text)
    assert s["short_lines_frac"] == 2 / 3  # non-blank lines of at most 30 chars
    assert s["char_dup_frac"] == 5 / (len(text) - 4)  # the second "short" over the text without newlines
    assert s["newline_word_ratio"] == 4 / 3


def test_c4_counts_lines() -> None:
    s = dt_scores("Lorem Ipsum dolor\nlorem\nipsum {x}")
    assert (s["lorem_ipsum"], s["curly_brackets"]) == (1.0, 1.0)


# --- rules and decisions -----------------------------------------------------------------------

def test_rule_table_thresholds_are_params_fields_and_scores_exist() -> None:
    fields = set(FilteredDocumentsParams.model_fields)
    assert {r.threshold_field for r in D.RULE_TABLE} <= fields
    assert {r.score for r in D.RULE_TABLE} <= set(D.SCORE_NAMES)
    assert all(r.name.startswith("dt_") for r in D.RULE_TABLE)
    assert len(set(D.RULES)) == len(D.RULES)


def test_reason_follows_datatrove_order_paragraphs_before_lines() -> None:
    para = "Some words here and the of to be.\n\n" * 4
    keep, reason, fails = H.decide(D.score_documents([para]), DT, D.exemptions(np.array([None], object)),
                                   D.RULE_TABLE)
    assert not keep[0]
    assert fails["dt_max_dup_para_frac"] == 1 and fails["dt_max_dup_line_frac"] == 1
    # min_words fails first (8 words < 50); with it off, the paragraph rule names it
    off = FilteredDocumentsParams(rules="datatrove", min_words=None)
    _, reason, _ = H.decide(D.score_documents([para]), off, rules=D.RULE_TABLE)
    assert reason.tolist() == ["dt_max_dup_para_frac"]


def test_fineweb_fields_need_the_datatrove_mode_and_the_mode_keys_the_output() -> None:
    with pytest.raises(ValidationError, match="set rules: datatrove"):
        FilteredDocumentsParams(max_short_lines_frac=0.67)
    with pytest.raises(ValidationError):
        FilteredDocumentsParams(rules="fineweb")  # type: ignore[arg-type]
    assert params_key("filtered_documents", DT) != params_key("filtered_documents", FilteredDocumentsParams())


def test_language_exemptions_follow_the_threshold_field() -> None:
    exempt = D.exemptions(np.array(["zh", "de", "en", None], object))
    assert exempt["dt_min_words"].tolist() == [True, False, False, False]
    assert exempt["dt_max_hash_word_ratio"].tolist() == [True, False, False, False]
    assert exempt["dt_min_stop_words"].tolist() == [True, True, False, False]
    assert "dt_max_dup_line_frac" not in exempt


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(x == b[k] or (math.isnan(x) and math.isnan(b[k])) for k, x in a.items())


@pytest.mark.parametrize("text", ["", "\n\n", " ", "...", "#", "{", "\r\n\u2028x"])
def test_degenerate_texts_score_without_dividing_by_zero(text: str) -> None:
    s = dt_scores(text)
    assert set(s) == set(D.SCORE_NAMES)
    assert all(math.isfinite(v) for k, v in s.items() if k != "mean_word_length")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.text(), repetitive_text), max_size=6))
def test_score_documents_equals_score_text_per_document(texts: list[str]) -> None:
    batch = D.score_documents(texts)
    for i, text in enumerate(texts):
        assert _same({name: float(batch[name][i]) for name in D.SCORE_NAMES}, dt_scores(text))


# --- agreement with datatrove on real text -----------------------------------------------------


# Documents planted to fail one rule each (their first failing rule) and one that passes them all.
PARA = ("The old harbour town sits between two green hills, and most visitors arrive by the morning ferry. "
        "Fishermen still mend their nets along the quay while children chase gulls across wet cobbles. "
        "A narrow street climbs from the market square towards a chapel with a painted wooden ceiling. "
        "Local bakers sell saffron buns that travellers describe as the best they have tasted anywhere. "
        "In winter, storms close the ferry for days, so families keep candles, flour and dried fish ready. "
        "Historians believe that merchants from distant ports traded wool here during the twelfth century. "
        "Today a small museum displays maps, coins and letters that were found beneath the customs house.")
WORDS = PARA.replace(",", "").replace(".", "").split()
PLANTED = {
    "short": "Too short to be a page.",
    "long words": " ".join(["incomprehensibilities"] * 60) + " the and.",
    "hashes": PARA + " " + " ".join(f"#{w}" for w in WORDS[:30]),
    "bullets": "\n".join(f"- {' '.join(WORDS[i:i + 6])}." for i in range(0, len(WORDS) - 6, 3)),
    "ellipsis lines": "\n".join(f"{' '.join(WORDS[i:i + 8])}..." for i in range(0, len(WORDS) - 8, 4)),
    "punctuation": PARA + " ( ) , ; = " * 12,
    "stop words": PARA.replace("the ", "").replace("The ", "").replace(" and ", " ").replace(" have ", " ")
                      .replace(" that ", " ").replace(" to", "").replace(" with ", " ").replace(" of ", " "),
    "duplicate paragraphs": PARA + "\n\nThank you for reading.\n\nThank you for reading.\n\nThank you for reading.",
    "duplicate lines": "\n".join(PARA.split(". ") + ["Thank you."] * 6),
    "no terminal punctuation": "\n".join(" ".join(WORDS[i:i + 9]) for i in range(0, len(WORDS), 9)),
    "short lines": "\n".join(" ".join(WORDS[i:i + 4]) + "." for i in range(0, len(WORDS), 4)),
    "char duplicates": "\n".join([*PARA.split(". "), PARA.split(". ")[2]]),
    "lorem": PARA + "\nLorem ipsum dolor sit amet.",
    "good": PARA,
}


FINEWEB = FilteredDocumentsParams(rules="datatrove", max_short_lines_frac=0.67, max_char_dup_frac=0.01,
                                  max_newline_word_ratio=0.3)
# What datatrove 0.10.1 says of them (test_planted_documents_get_datatrove_reasons_when_installed)
PLANTED_REASONS = {
    "short": "dt_min_words", "long words": "dt_max_mean_word_length", "hashes": "dt_max_hash_word_ratio",
    "bullets": "dt_max_bullet_lines_frac", "ellipsis lines": "dt_max_ellipsis_word_ratio",
    "punctuation": "dt_min_alpha_words_frac", "stop words": "dt_min_stop_words",
    "duplicate paragraphs": "dt_max_dup_para_frac", "duplicate lines": "dt_max_dup_line_frac",
    "no terminal punctuation": "dt_min_terminal_punct_lines_frac", "short lines": "dt_max_short_lines_frac",
    "char duplicates": "dt_max_char_dup_frac", "lorem": "dt_max_lorem_ipsum", "good": None,
}


def test_planted_documents_fail_their_rule() -> None:
    _, reason, _ = H.decide(D.score_documents(list(PLANTED.values())), FINEWEB, rules=D.RULE_TABLE)
    assert dict(zip(PLANTED, reason.tolist(), strict=True)) == PLANTED_REASONS


def test_planted_documents_get_datatrove_reasons_when_installed() -> None:
    pytest.importorskip("datatrove")
    pytest.importorskip("spacy")
    from datatrove.data import Document
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )
    from datatrove.pipeline.filters.base_filter import get_filter_result

    filters = [GopherQualityFilter(), GopherRepetitionFilter(), FineWebQualityFilter(),
               C4QualityFilter(remove_citations=False, filter_no_terminal_punct=False, min_num_sentences=-1,
                               min_words_per_line=-1, max_word_length=-1, filter_javascript=False,
                               filter_curly_bracket=False, filter_policy=False)]
    _, ours, _ = H.decide(D.score_documents(list(PLANTED.values())), FINEWEB, rules=D.RULE_TABLE)
    theirs = []
    for text in PLANTED.values():
        reason = None
        for f in filters:
            kept, why = get_filter_result(f.filter(Document(text=text, id="x")))
            if not kept:
                reason = why
                break
        theirs.append(reason)
    assert len(set(ours.tolist())) == len(PLANTED)  # each fails a different rule, "good" none
    mapped = [None if r is None else _DT_REASON.get(r, f"dt_{r}") for r in theirs]
    assert dict(zip(PLANTED, ours.tolist(), strict=True)) == dict(zip(PLANTED, mapped, strict=True))


_DT_REASON = {
    "gopher_short_doc": "dt_min_words", "gopher_long_doc": "dt_max_words",
    "gopher_below_avg_threshold": "dt_min_mean_word_length", "gopher_above_avg_threshold": "dt_max_mean_word_length",
    "gopher_too_many_hashes": "dt_max_hash_word_ratio", "gopher_too_many_ellipsis": "dt_max_ellipsis_word_ratio",
    "gopher_too_many_bullets": "dt_max_bullet_lines_frac", "gopher_too_many_end_ellipsis": "dt_max_ellipsis_lines_frac",
    "gopher_below_alpha_threshold": "dt_min_alpha_words_frac", "gopher_enough_stop_words": "dt_min_stop_words",
    "dup_para_frac": "dt_max_dup_para_frac", "dup_para_char_frac": "dt_max_dup_para_char_frac",
    "dup_line_frac": "dt_max_dup_line_frac", "dup_line_char_frac": "dt_max_dup_line_char_frac",
    "line_punct_ratio": "dt_min_terminal_punct_lines_frac", "short_line_ratio": "dt_max_short_lines_frac",
    "char_dup_ratio": "dt_max_char_dup_frac", "list_ratio": "dt_max_newline_word_ratio",
    "lorem_ipsum": "dt_max_lorem_ipsum",
    **{f"top_{n}_gram": f"dt_max_top_{n}gram_char_frac" for n in H.TOP_NGRAMS},
    **{f"duplicated_{n}_n_grams": f"dt_max_dup_{n}gram_char_frac" for n in H.DUP_NGRAMS},
}


# --- the program -------------------------------------------------------------------------------

def test_program_runs_the_datatrove_rules_with_their_own_reasons_and_cache(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "data"))
    default = spec(stages=("heuristic",))
    datatrove = spec(stages=("heuristic",), params={"filtered_documents": {"rules": "datatrove"}})
    run_all(store, default)
    run_all(store, datatrove)
    for source in datatrove.sources:
        removed = read(store, datatrove, "filtered_documents", "removed", source)
        reasons = set(removed["reason"].to_pylist())
        assert reasons and all(r.startswith("dt_") for r in reasons), reasons
        base = read(store, default, "filtered_documents", "removed", source)
        assert not any(r.startswith("dt_") for r in base["reason"].to_pylist())
        decisions = read(store, datatrove, "filtered_documents", "decisions", source)
        assert pc.sum(pc.invert(decisions["keep"])).as_py() == removed.num_rows
    # one score cache per source and mode
    assert len(list((tmp_path / "data" / "heuristic_scores").iterdir())) == 2 * len(datatrove.sources)
