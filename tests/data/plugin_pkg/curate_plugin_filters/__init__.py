"""A user's package of custom filters (stages.filters' protocol), for tests/stages/test_custom_filters.py.

Registered by entry point (group ``curation_dagster.filters``) in a temporary site folder, or named
as ``curate_plugin_filters:Class`` with this folder's parent on sys.path.
"""

from __future__ import annotations


class MentionsWord:
    """Removes documents that mention ``word`` (case-insensitive); the score is how many times."""

    name = "mentions_word"
    version = 1

    def __init__(self, word: str) -> None:
        self.word = word.lower()

    def score(self, text: str) -> float:
        return float(text.lower().count(self.word))

    def keep(self, score: float) -> bool:
        return score == 0


class DigitShare:
    """Removes documents whose share of digit characters is above ``max_share``; ``max_share`` is
    read only by keep(), so changing it re-decides from cached scores."""

    name = "digit_share"
    version = 1
    keep_kwargs = ("max_share",)

    def __init__(self, max_share: float = 0.05) -> None:
        self.max_share = max_share

    def score(self, text: str) -> float:
        return sum(c.isdigit() for c in text) / len(text) if text else 0.0

    def keep(self, score: float) -> bool:
        return score <= self.max_share


class Fragile:
    """Raises on a document containing ``marker``: a filter with a bug."""

    name = "fragile"
    version = 1

    def __init__(self, marker: str = "EXPLODE") -> None:
        self.marker = marker

    def score(self, text: str) -> float:
        if self.marker in text:
            raise ValueError(f"cannot score a text with {self.marker}")
        return 0.0

    def keep(self, score: float) -> bool:
        return True
