"""env.py: one home for every variable, readers that warn instead of raising, the rank; and the
warning helper every message goes through."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import mstx_marks
from mstx_marks.base import diagnostics, env


def _warnings() -> warnings.catch_warnings[list[warnings.WarningMessage]]:
    w = warnings.catch_warnings(record=True)
    return w


@pytest.mark.parametrize(
    ("raw", "value"),
    [("1", True), ("on", True), ("Yes", True), ("TRUE", True), ("0", False), ("off", False)],
)
def test_flags_take_every_spelling(monkeypatch: pytest.MonkeyPatch, raw: str, value: bool) -> None:
    monkeypatch.setenv(env.DISABLE, raw)
    assert env.flag(env.DISABLE) is value


def test_a_junk_flag_warns_once_and_keeps_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.DISABLE, "maybe")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert env.flag(env.DISABLE) is False
        assert env.flag(env.DISABLE) is False
    assert len(w) == 1 and "MSTX_MARKS_DISABLE='maybe'" in str(w[0].message)


def test_disable_on_switches_ranges_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.DISABLE, "on")  # ignored before: only 1/true/yes counted
    assert mstx_marks.is_active() is False


@pytest.mark.parametrize("raw", ["1e5", "-5", "0", "lots"])
def test_a_junk_capacity_warns(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(env.RECORD_CAPACITY, raw)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert env.positive_int(env.RECORD_CAPACITY, 7) == 7
    assert len(w) == 1 and raw in str(w[0].message) and "int >= 1" in str(w[0].message)


@pytest.mark.parametrize(("raw", "rank"), [(" 1", 1), ("3\n", 3), ("0", 0)])
def test_rank_reads_blanks_around_digits(
    monkeypatch: pytest.MonkeyPatch, raw: str, rank: int
) -> None:
    monkeypatch.setenv("RANK", raw)
    assert env.rank() == rank


@pytest.mark.parametrize("raw", ["²", "-1", "one", "1.0"])
def test_a_junk_rank_warns_once_and_falls_back(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("RANK", raw)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert env.rank() == 0
        assert env.rank() == 0
    assert len(w) == 1 and "RANK" in str(w[0].message)


def test_junk_rank_still_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """RANK='²' used to record nothing (and recurse at every range start)."""
    monkeypatch.setenv("RANK", "²")
    monkeypatch.setenv(env.RANKS, "0")
    rec = mstx_marks.default_recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mstx_marks.configure(backend="record")
        with mstx_marks.mark("step"):
            pass
    assert [r.name for r in rec.records()] == ["step"]


def test_every_variable_the_library_reads_is_declared() -> None:
    """No module reads an MSTX_MARKS_* variable by a literal name behind env.py's back."""
    package = Path(mstx_marks.__file__).parent
    declared = {v.name for v in env.VARIABLES}
    for source in package.rglob("*.py"):
        for name in re.findall(r"MSTX_MARKS_[A-Z_]+", source.read_text(encoding="utf-8")):
            assert name in declared, f"{source.name} mentions {name}, which env.py does not declare"


# --- diagnostics ------------------------------------------------------------------------------


def test_warnings_point_at_the_users_line() -> None:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mstx_marks.mark("é" * 100)  # a run-time name too long for MSTX: truncated, one warning
    assert len(w) == 1
    assert w[0].category is mstx_marks.MstxMarksWarning
    assert w[0].filename == __file__


def test_warnings_never_raise_even_under_W_error() -> None:
    code = (
        "import mstx_marks\n"
        "mstx_marks.configure(backend='record')\n"
        "with mstx_marks.mark('é' * 100):\n"
        "    print('body ran')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "body ran\n"
    assert "MstxMarksWarning: mstx_marks: range name" in proc.stderr


def test_our_category_filters_all_of_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "x")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=mstx_marks.MstxMarksWarning)
        env.rank()
        diagnostics.warn("anything")
    assert w == []


def test_the_instrument_variable_lists_every_preset() -> None:
    from mstx_marks.capture import presets

    # The table the docs show: the names are the presets' own, declared when they are imported.
    (row,) = [r for r in env.markdown_table().splitlines() if f"`{env.INSTRUMENT}`" in r]
    values, meaning = row.split(" | ")[1:3]
    listed = [w.strip() for w in values.removeprefix("comma-separated:").split(",")]
    assert listed == list(presets.FRAMEWORKS)
    for alias, name in presets.ALIASES.items():
        assert f"`{alias}` is `{name}`'s other name" in meaning
