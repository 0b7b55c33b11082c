"""Language identification of documents by voting over their prose, and the keep decision.

A whole-page classifier is confused by technical pages: option lists, command lines, paths and
code are language-less tokens that pull a German manual page towards English and push an
English one's confidence far below the usual thresholds (fastText lid.176 gives over half of the
standard library's English ``pydoc`` pages a score under 0.65: docs/language.md). So a document
is judged by its prose only:

1. *lines*: ``text.split("\\n")``, stripped. A line is skipped when it is a shell or REPL prompt
   (``$ ``, ``# ``, ``>>> ``, ``... ``, ``% ``, ``PS> ``, ``C:\\>``), a code statement
   (``CODE_LINE``) or when fewer than ``MIN_WORD_FRAC`` of its non-space characters are in *words*.
2. *words*: whitespace-separated tokens with a letter, no digit and none of ``CODE_CHARS``, that
   are not options (``-x``, ``--long``); surrounding punctuation is stripped. Tokens that are not
   words (``%s``, ``/etc/passwd``, ``PASS_MIN_DAYS``, ``--help``, ``foo()``) are dropped from the
   line's text before classification.
3. *blocks*: runs of consecutive prose lines (a blank or skipped line ends one), their words joined
   by spaces, cut at ``BLOCK_CHARS``; at most ``MAX_PROSE_CHARS`` of a document are classified.
4. *vote*: the classifier gives each block its ``TOP_K`` most likely languages with probabilities;
   each block weighs its number of letters (``str.isalpha``). ``score(lang) = sum(letters x
   p(lang)) / sum(letters)``; the document's language is the highest-scoring one, its score that
   value. A document without prose (pure code, a table of numbers) is classified whole instead,
   newlines replaced by spaces; one without any letter is ``UNDETERMINED`` with score 0.

``decide`` keeps a document when ``languages`` is empty, or its language is one of them and its
score is at least ``min_score``.

Shapes: ``identify`` takes n texts and returns ``language`` object (n,) of str (ISO 639 codes as
the model names them), ``score`` float64 (n,) in [0, 1], ``prose_chars`` int64 (n,) (letters that
voted; 0 where the whole text was classified).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from stages import versions

# 1: prose blocks, letter-weighted top-3 vote (bump when a language or score can change).
IDENTIFIER_VERSION: int = versions.LANGUAGE_IDENTIFIER  # bumped in stages/versions.py, which keys the outputs

UNDETERMINED = "und"
TOP_K = 3
BLOCK_CHARS = 1000
MAX_PROSE_CHARS = 20_000
MIN_WORD_FRAC = 0.6
MIN_BLOCK_LETTERS = 20  # a shorter block votes with weight letters**2 / MIN_BLOCK_LETTERS
# Characters that never occur in a word of prose but do in paths, code, markup and format strings.
CODE_CHARS = frozenset("/\\=_$%{}<>|@#*~^&+[]`0123456789")
WORD_PUNCT = "\"'.,;:!?()«»‹›“”„‟‘’‚‛¡¿…·、。，．！？：；（）「」『』【】《》〈〉〔〕［］"
# Quote, box and bullet marks before a line's text (pydoc's "|  ", "> ", "* ", "- ").
MARKS = re.compile(r"^(?:[|│>*•·+\-]+\s+)+")
PROMPTS = ("$ ", "# ", ">>> ", "... ", "% ", "PS> ", "C:\\>", "> ")
# Statements of common languages: a keyword first and code punctuation after it.
_STATEMENT = (
    r"(?:def|class|import|from|return|if|elif|else|for|while|try|except|with|raise|print|var|let|"
    r"const|function|func|fn|public|private|static|void|int|char|struct|package|use|sudo|echo|cd|"
    r"export|apt|apt-get|pip|npm|git|make|curl|wget)\b.*(?:[:;{}()=]|\s-{1,2}\w)"
)
# A code line: such a statement, or a line that ends with a brace or ");", or starts with a closer.
CODE_LINE = re.compile("^" + _STATEMENT + r"|(?:[{}]|\);)$|^[})\]]")
_STATEMENT_AT_START = re.compile(_STATEMENT)
_CODE_ENDS = ("{", "}", ");")
_CODE_STARTS = ("}", ")", "]")


def _code_line(line: str) -> bool:
    """Whether ``CODE_LINE`` finds code in ``line`` (stripped: no newline, so ``$`` is its end):
    its unanchored middle alternative made ``search`` try every position of every line (2.2 us a
    line of the sample's text); the same three tests one by one take 0.5."""
    return line.endswith(_CODE_ENDS) or line.startswith(_CODE_STARTS) or _STATEMENT_AT_START.match(line) is not None


# Scripts written without spaces between words: whitespace "words" there are whole phrases.
NO_SPACE_LANGUAGES: frozenset[str] = frozenset({
    "zh", "ja", "th", "lo", "km", "my", "bo", "dz", "wuu", "yue", "gan", "jbo",
})

_CAMEL = re.compile(r"[a-z][A-Z]")

Predict = Callable[[list[str]], tuple[Sequence[Sequence[str]], Sequence[npt.ArrayLike]]]
"""The classifier: texts (no newlines) -> (labels per text, probabilities per text), best first,
labels as language codes (``en``, not ``__label__en``)."""


def _word(token: str) -> str:
    """``token`` stripped of surrounding punctuation if it is a word of prose, else ''."""
    if token[0] == "-" and len(token) > 1 and (token[1] == "-" or token[1].isalnum()):
        return ""  # an option: -x, --long-name
    if not CODE_CHARS.isdisjoint(token):
        return ""
    core = token.strip(WORD_PUNCT)
    if len(core) < 2 or not any(c.isalpha() for c in core):
        return ""  # a lone character (a table cell, a variable) says nothing of the language
    if "." in core or "(" in core or ")" in core or core.count("-") > 1:  # foo.bar, call(), a-package-name
        return ""
    if _CAMEL.search(core):  # an identifier: XShapeQueryExtension, destKind, getValue
        return ""
    return core


WORDS_KEPT = 1 << 16  # tokens a ``_Words`` remembers before it starts afresh


class _Words(dict[str, str]):
    """``_word`` of each token looked up, remembered for the texts of one ``identify`` call (a
    text's words repeat, and so do a batch's): a token seen before costs a lookup in C, not
    ``_word``'s tests. At most ``WORDS_KEPT`` tokens (each a copy): a batch of numeric tables or
    code, whose tokens rarely repeat, would otherwise hold them all (700k distinct tokens of 5.6 MB
    of text: 89 MB); ``_word`` is a function of the token alone, so forgetting changes nothing."""

    def __missing__(self, token: str) -> str:
        if len(self) >= WORDS_KEPT:
            self.clear()
        word = self[token] = _word(token)
        return word


def prose_blocks(text: str, words_of: _Words | None = None) -> list[str]:
    """The blocks of prose of one document (see the module docstring), in order; ``words_of``:
    the tokens' words known so far (``identify``'s, for its batch), else a fresh one."""
    known = (_Words() if words_of is None else words_of).__getitem__
    blocks: list[str] = []
    current: list[str] = []
    size = 0
    total = 0

    def flush() -> None:
        nonlocal current, size
        if current:
            blocks.append(" ".join(current))
        current, size = [], 0

    for raw in text.split("\n"):
        line = raw.strip()
        if line.startswith(PROMPTS):
            flush()
            continue
        line = MARKS.sub("", line)
        if not line or _code_line(line):
            flush()
            continue
        tokens = line.split()
        words = [w for w in map(known, tokens) if w]
        word_chars = sum(map(len, words))
        if not words or word_chars < MIN_WORD_FRAC * sum(map(len, tokens)):
            flush()
            continue
        if sum(map(str.isupper, words)) * 2 > len(words):
            # An upper-case line (a heading, Unicode character names) is rare in the model's
            # training text: lower-cased. A lone acronym stays as it is ("MIT" is not "mit").
            words = [w.lower() for w in words]
        prose = " ".join(words)
        if size + len(prose) > BLOCK_CHARS:
            flush()
        current.append(prose)
        size += len(prose) + 1
        total += len(prose)
        if total >= MAX_PROSE_CHARS:
            break
    flush()
    return blocks


def _letters(text: str) -> int:
    return sum(map(str.isalpha, text))


def identify(
    texts: Sequence[str], predict: Predict, top_k: int = TOP_K
) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """(language object (n,), score float64 (n,), prose_chars int64 (n,)) of each text.

    All blocks of the batch go to ``predict`` in one call, then the weighted vote is per document.
    """
    n = len(texts)
    language = np.full(n, UNDETERMINED, dtype=object)
    score = np.zeros(n, dtype=np.float64)
    prose_chars = np.zeros(n, dtype=np.int64)
    queries: list[str] = []
    owner: list[int] = []
    weight: list[float] = []
    whole: list[int] = []
    words_of = _Words()
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] is {type(text).__name__}, expected str")
        blocks = prose_blocks(text, words_of)
        if blocks:
            for b in blocks:
                queries.append(b)
                owner.append(i)
                letters = _letters(b)
                weight.append(letters if letters >= MIN_BLOCK_LETTERS else letters * letters / MIN_BLOCK_LETTERS)
        elif any(c.isalpha() for c in text):
            whole.append(i)
            queries.append(" ".join(text[: 4 * MAX_PROSE_CHARS].split()))
            owner.append(i)
            weight.append(1)
    if not queries:
        return language, score, prose_chars
    labels, probs = predict(queries)
    votes: list[dict[str, float]] = [{} for _ in range(n)]
    totals = np.zeros(n, dtype=np.float64)
    for q, i in enumerate(owner):
        w = float(weight[q])
        totals[i] += w
        for label, p in zip(list(labels[q])[:top_k], np.asarray(probs[q], dtype=np.float64)[:top_k], strict=False):
            votes[i][label] = votes[i].get(label, 0.0) + w * min(float(p), 1.0)
    whole_set = set(whole)
    for i in range(n):
        if not votes[i] or totals[i] <= 0:
            continue
        best = max(sorted(votes[i]), key=votes[i].__getitem__)  # sorted: ties go to the lowest code
        language[i] = best
        score[i] = min(votes[i][best] / totals[i], 1.0)
        prose_chars[i] = 0 if i in whole_set else int(totals[i])
    return language, score, prose_chars


def decide(
    language: npt.NDArray[np.object_], score: npt.NDArray[np.float64], languages: Sequence[str], min_score: float
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.object_]]:
    """``keep`` bool (n,) and ``reason`` object (n,): None for a kept document,
    ``language:<lang>`` for one in another language, ``language:<lang>:low_score`` for one in a
    kept language whose score is under ``min_score``. An empty ``languages`` keeps everything."""
    n = len(language)
    reason = np.full(n, None, dtype=object)
    if not languages:
        return np.ones(n, dtype=bool), reason
    wanted = np.isin(language.astype(str), np.asarray(list(languages), dtype=str))
    confident = score >= min_score
    keep = wanted & confident
    for i in np.flatnonzero(~keep).tolist():
        reason[i] = f"language:{language[i]}" if not wanted[i] else f"language:{language[i]}:low_score"
    return keep, reason
