"""Counters of repeated work, for the tests that hold a cost to once per block or step."""

from __future__ import annotations

import pytest

from stages.spec import CrawlSpec


def count_params_validations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The programs whose params ``CrawlSpec.program_params`` validates from now on, one entry
    per call (deriving a crawl's keys validates every program's params)."""
    validated: list[str] = []
    real = CrawlSpec.program_params

    def counted(self: CrawlSpec, program: str, source: str | None = None) -> object:
        validated.append(program)
        return real(self, program, source)

    monkeypatch.setattr(CrawlSpec, "program_params", counted)
    return validated
