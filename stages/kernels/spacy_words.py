"""spaCy's English word tokenizer in plain Python, for the datatrove heuristics mode.

datatrove's Gopher and FineWeb filters count words as ``spacy.blank("en")`` tokenizes them,
each token stripped and whitespace tokens dropped (``SpaCyTokenizer.word_tokenize``). This is a
port of that tokenizer's algorithm (``spacy/tokenizer.pyx``: ``_tokenize_affixes``,
``_split_affixes``, ``_attach_tokens`` and the special-case matcher of
``_apply_special_cases``) over its own English rules, copied into ``datatrove_rules`` by
bench/datatrove_rules.py, so the mode needs no spaCy at run time.

A text is split at whitespace into chunks; each chunk is either a special case (``don't`` ->
``do``, ``n't``) or is peeled of prefixes and suffixes (punctuation, ``'s``, units) until a
special case or nothing is left, then the rest is kept whole if it is a URL and otherwise split
at infixes (hyphens between letters, ``...``, ``/``...). Finally, token runs that spell a special
case containing punctuation (``:)``, ``(:``) are replaced by that case's tokens, with spaCy's
quirk kept: its matcher also finds runs across a single space, which are never replaced but
block the runs they overlap (``"=) :)"`` keeps ``:`` ``)`` apart, since ``) :`` spells ``):``).

Checked against spaCy 3.8.18 on every sample document and on 60,000 random strings of special
cases, URLs and punctuation (tests/stages/kernels/test_heuristics_datatrove.py runs a share of them where spaCy
is installed): the same tokens for all.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from stages.kernels import datatrove_rules as R

_PREFIX = re.compile(R.PREFIX).search
_SUFFIX_RE = re.compile(R.SUFFIX)
_INFIX = re.compile(R.INFIX).finditer
_URL = re.compile(R.URL).match
_SPECIAL: dict[str, tuple[str, ...]] = R.SPECIAL_CASES


def _SUFFIX(text: str) -> re.Match[str] | None:
    """``SUFFIX.search(text)``, trying only the start positions a match can have: every branch
    ends at the end and consumes at most ``SUFFIX_MAX_WIDTH`` chars, except those that end in a
    run of a ``SUFFIX_UNBOUNDED_LAST`` char (lookbehinds still see the text before ``pos``)."""
    if text.endswith(tuple(R.SUFFIX_UNBOUNDED_LAST)):
        return _SUFFIX_RE.search(text)
    return _SUFFIX_RE.search(text, max(0, len(text) - R.SUFFIX_MAX_WIDTH))


def _affix_len(search: Callable[[str], re.Match[str] | None], text: str) -> int:
    match = search(text)
    return match.end() - match.start() if match is not None else 0


def _split_affixes(chunk: str, specials: bool) -> tuple[list[str], str, list[str]]:
    """(prefixes, the rest, suffixes in the order they were cut), as spaCy's ``_split_affixes``."""
    prefixes: list[str] = []
    suffixes: list[str] = []
    last_size = 0
    while chunk and len(chunk) != last_size:
        if specials and chunk in _SPECIAL:
            break
        last_size = len(chunk)
        pre_len = _affix_len(_PREFIX, chunk)
        if pre_len:
            prefix, minus_pre = chunk[:pre_len], chunk[pre_len:]
            if minus_pre and specials and minus_pre in _SPECIAL:
                prefixes.append(prefix)
                chunk = minus_pre
                break
        suf_len = _affix_len(_SUFFIX, chunk[pre_len:])
        if suf_len:
            suffix, minus_suf = chunk[-suf_len:], chunk[:-suf_len]
            if minus_suf and specials and minus_suf in _SPECIAL:
                suffixes.append(suffix)
                chunk = minus_suf
                break
        if pre_len and suf_len and pre_len + suf_len <= len(chunk):
            prefixes.append(prefix)
            suffixes.append(suffix)
            chunk = chunk[pre_len:-suf_len]
        elif pre_len:
            prefixes.append(prefix)
            chunk = minus_pre
        elif suf_len:
            suffixes.append(suffix)
            chunk = minus_suf
    return prefixes, chunk, suffixes


def _chunk_tokens(chunk: str, specials: bool = True) -> list[str]:
    """Tokens of one whitespace-free chunk before the special-case matcher."""
    if specials and chunk in _SPECIAL:
        return list(_SPECIAL[chunk])
    tokens, rest, suffixes = _split_affixes(chunk, specials)
    if rest:
        if specials and rest in _SPECIAL:
            tokens.extend(_SPECIAL[rest])
        elif rest.isalnum() or _URL(rest):  # infixes are punctuation and symbols: never in letters and digits
            tokens.append(rest)
        else:
            start = 0
            for match in _INFIX(rest):
                begin, end = match.start(), match.end()
                if begin == 0:  # an infix at the very start is not a split point
                    continue
                if begin != start:
                    tokens.append(rest[start:begin])
                if begin != end:
                    tokens.append(rest[begin:end])
                start = end
            if rest[start:]:
                tokens.append(rest[start:])
    tokens.extend(reversed(suffixes))
    return tokens


def _matcher_patterns() -> tuple[dict[tuple[str, ...], tuple[str, ...]], dict[str, tuple[int, ...]]]:
    """{token run: its special case's tokens} for every case spaCy's special matcher looks for
    (those with a prefix, suffix or infix), and {first token of a run: the run lengths}."""
    patterns: dict[tuple[str, ...], tuple[str, ...]] = {}
    for orth, pieces in _SPECIAL.items():
        if orth.isspace() or not (_affix_len(_PREFIX, orth) or _affix_len(_SUFFIX, orth) or any(_INFIX(orth))):
            continue
        run = tuple(_chunk_tokens(orth, specials=False))
        if run:
            patterns[run] = pieces
    lengths: dict[str, set[int]] = {}
    for run in patterns:
        lengths.setdefault(run[0], set()).add(len(run))
    return patterns, {first: tuple(sorted(n)) for first, n in lengths.items()}


_PATTERNS, _RUN_LENGTHS = _matcher_patterns()
_WHITESPACE = re.compile(r"(\s+)")  # \s is str.isspace for str patterns, as spaCy splits


def _apply_special_runs(tokens: list[str | None], chunk: list[int]) -> list[str]:
    """spaCy's ``_apply_special_cases`` over a document's tokens (``None``: a whitespace token;
    ``chunk[i]``: the whitespace-separated chunk token i came from).

    Runs of tokens that spell a special case are found anywhere, across chunks too (spaCy's
    phrase matcher ignores the single spaces between tokens); they are taken longest first, then
    earliest, skipping a run whose first or last token is already taken; a taken run is replaced
    by its case's tokens only if it lies within one chunk (its text, spaces included, is the
    case), otherwise it stays as it is but still blocks the runs it overlaps.
    """
    spans = []
    for start, token in enumerate(tokens):
        if token is None or token not in _RUN_LENGTHS:
            continue
        for n in _RUN_LENGTHS[token]:
            if start + n <= len(tokens) and tuple(tokens[start : start + n]) in _PATTERNS:
                spans.append((start, start + n))
    if not spans:
        return [t for t in tokens if t is not None]
    spans.sort(key=lambda s: (s[0] - s[1], s[0]))
    taken: set[int] = set()
    chosen: dict[int, int] = {}
    for start, stop in spans:
        if start not in taken and stop - 1 not in taken and chunk[start] == chunk[stop - 1]:
            chosen[start] = stop
        taken.update(range(start, stop))
    out: list[str] = []
    i = 0
    while i < len(tokens):
        end = chosen.get(i)
        if end is not None:
            out.extend(_PATTERNS[tuple(tokens[i:end])])  # type: ignore[arg-type]  # no None in a run
            i = end
        else:
            token = tokens[i]
            if token is not None:
                out.append(token)
            i += 1
    return out


def words(text: str, memo: dict[str, list[str]] | None = None) -> list[str]:
    """datatrove's ``split_into_words(text, "en")``: ``spacy.blank("en")``'s tokens of ``text``,
    stripped, whitespace tokens dropped. ``memo`` caches chunk -> tokens across calls (chunks
    repeat a lot; spaCy caches them too)."""
    memo = {} if memo is None else memo
    tokens: list[str | None] = []
    chunk: list[int] = []
    for k, part in enumerate(_WHITESPACE.split(text)):
        if k % 2:  # a whitespace run: one plain space separates tokens, anything else is a token
            if part != " ":
                tokens.append(None)
                chunk.append(k)
            continue
        if not part:
            continue
        found = memo.get(part)
        if found is None:
            found = memo[part] = _chunk_tokens(part)
        tokens.extend(found)
        chunk.extend([k] * len(found))
    return [s for s in map(str.strip, _apply_special_runs(tokens, chunk)) if s]
