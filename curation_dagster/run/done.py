"""A partition's end as its recorder receives it (``Done``), wherever it ran: a warm pool's
worker, which imports no Dagster, makes it as the recording process does."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stages.checks import Verdict
from stages.execute import Outcome
from stages.timing import FIGURES


@dataclass(frozen=True)
class Done:
    """One partition's end: its outcome, its materialization metadata and check verdicts (each
    check that applies: name, blocking, verdict), or its error on one line and its traceback.
    ``busy``: the seconds its work took outside the program (launch, planning, commit, metadata,
    checks), wherever it ran, up to when it was handed to the recorder."""

    program: str
    source: str | None
    outcome: Outcome | None = None
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    verdicts: list[tuple[str, bool, Verdict]] = field(default_factory=list)
    busy: float = 0.0
    trace: str = ""

    def blocking_failures(self) -> list[tuple[str, Verdict]]:
        """The blocking checks of this partition that failed (name, verdict)."""
        return [(name, v) for name, blocking, v in self.verdicts
                if blocking and not v.passed and v.severity == "ERROR"]


# Timings, shown after every count (the UI lists metadata in the order it is given), so a
# partition's page reads counts first and its Plots tab keeps one series per figure.
TIMINGS = ("seconds", *FIGURES, "overhead_s")
