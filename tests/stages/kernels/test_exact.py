"""stages.kernels.exact: the documented normalization, hashes and duplicate groups."""

from __future__ import annotations

import re
import sys
import unicodedata

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.kernels.exact import duplicate_groups, normalize, text_hashes

SAME = [
    # (variant, canonical): equal after NFKC + whitespace collapsing + strip
    ("  hello   world \n", "hello world"),
    ("hello\tworld", "hello world"),
    ("hello\r\n\r\nworld", "hello world"),
    ("hello\u00a0world", "hello world"),  # no-break space
    ("hello\u3000world", "hello world"),  # ideographic space
    ("hello\u2003\u2009world", "hello world"),  # em space, thin space
    ("\ufb01sh and chips", "fish and chips"),  # ligature fi
    ("\uff28\uff45\uff4c\uff4c\uff4f", "Hello"),  # full-width letters
    ("\uff11\uff12\uff13", "123"),  # full-width digits
    ("cafe\u0301", "café"),  # combining accent composes
    ("x\u00b2", "x2"),  # superscript two
    ("\u2460 item", "1 item"),  # circled one
]
DIFFERENT = [
    ("Hello world", "hello world"),  # case is kept by default
    ("hello world.", "hello world"),  # punctuation counts
    ("helloworld", "hello world"),  # a missing space is not whitespace collapsing
    ("hello\u200bworld", "helloworld"),  # a zero-width space is not whitespace (and NFKC keeps it)
]


@pytest.mark.parametrize(("variant", "canonical"), SAME)
def test_normalization_catches_variants(variant: str, canonical: str) -> None:
    assert normalize(variant) == canonical
    a, b = text_hashes([variant, canonical])
    assert a.tolist() == b.tolist()


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_normalization_keeps_real_differences(a: str, b: str) -> None:
    assert normalize(a) != normalize(b)
    ha, hb = text_hashes([a, b])
    assert ha.tolist() != hb.tolist()


_WHITESPACE = [c for c in map(chr, range(sys.maxunicode + 1)) if re.fullmatch(r"\s", c)]


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from([*_WHITESPACE, "a", "B", "\u00e9", "\u4e2d", "\x00", "\u200b", "\ufb01"]), max_size=20))
def test_whitespace_is_collapsed_as_the_documented_regular_expression_does(text: str) -> None:
    # normalize joins str.split()'s pieces: the same whitespace as re's \s, every code point of it
    assert len(_WHITESPACE) == 29 and all(c.isspace() for c in _WHITESPACE)
    nfkc = unicodedata.normalize("NFKC", text)
    assert normalize(text) == re.sub(r"\s+", " ", nfkc).strip()


def test_lowercase_case_folds() -> None:
    assert normalize("Straße  ÜBER", lowercase=True) == "strasse über"
    assert normalize("Straße", lowercase=False) == "Straße"
    h = text_hashes(["Hello World", "hello world"], lowercase=True)
    assert h[0].tolist() == h[1].tolist()
    assert text_hashes(["Hello World"])[0].tolist() != h[0].tolist()


def test_hash_is_xxh3_128_of_the_normalized_utf8() -> None:
    (h,) = text_hashes(["  Ｈello \n world  "])
    want = xxhash.xxh3_128_intdigest(b"Hello world")
    assert (int(h[0]) << 64) | int(h[1]) == want
    assert text_hashes([]).shape == (0, 2) and text_hashes([]).dtype == np.uint64


def test_lone_surrogates_do_not_crash() -> None:
    assert text_hashes(["a\ud800b"]).shape == (1, 2)


def test_duplicate_groups() -> None:
    texts = ["a b", "c", "a  b", "\uff43", "d", "a b "]
    groups = duplicate_groups(text_hashes(texts))
    assert groups.dtype == np.int64 and groups.shape == (6,)
    assert groups[0] == groups[2] == groups[5]
    assert groups[1] == groups[3]
    assert len({groups[0], groups[1], groups[4]}) == 3
    assert duplicate_groups(np.zeros((0, 2), np.uint64)).shape == (0,)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["alpha", "Alpha", " alpha ", "alpha\n", "beta", "b\u0065ta", "ｂｅｔａ", "gamma x",
                                 "gamma  x", "gamma\tx", "gammax"]), max_size=30))
def test_groups_are_exactly_equal_normalized_texts(texts: list[str]) -> None:
    groups = duplicate_groups(text_hashes(texts)).tolist()
    for i in range(len(texts)):
        for j in range(len(texts)):
            assert (groups[i] == groups[j]) == (normalize(texts[i]) == normalize(texts[j]))


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_normalization_is_idempotent(text: str) -> None:
    once = normalize(text)
    assert normalize(once) == once
    assert once == once.strip() and "  " not in once
