"""The one reset every test starts from (the autouse fixture in conftest.py calls it; property
tests call it per example, since Hypothesis runs many examples inside one fixture scope)."""

from __future__ import annotations

from mstx_marks.core.process import PROCESS


def fresh() -> None:
    """Fresh settings, recorder, auto-detection cache, once-only warnings, held ranges, and no
    recording session (a test's files are its own): the process starts over."""
    PROCESS.start_over()
