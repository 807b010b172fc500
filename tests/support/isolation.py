"""The one reset every test starts from (the autouse fixture in conftest.py calls it; property
tests call it per example, since Hypothesis runs many examples inside one fixture scope)."""

from __future__ import annotations

import sys

import mstx_marks
from mstx_marks import backends
from mstx_marks.backends.reopen import WAITING
from mstx_marks.base import diagnostics
from mstx_marks.core import routing as settings


def fresh() -> None:
    """Fresh settings, recorder, auto-detection cache, once-only warnings, and no recording
    session (a test's files are its own)."""
    out = sys.modules.get("mstx_marks.export.out")
    if out is not None:
        out.forget()
    settings.reset()
    backends._detected = None
    diagnostics.forget_warnings()
    mstx_marks.default_recorder().clear()
    WAITING.clear()  # no range held for a profiler, and no watched profiler yet
