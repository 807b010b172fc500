"""Issue 27, the edges a long job meets in its environment (mstx_marks/base/env.py,
launch/activate.py, cli/doctor.py): numbers too long for int(), values too long to echo, names
mistyped with our prefix."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from mstx_marks.base import env
from mstx_marks.export.spill import read_spill

#: A number past CPython's limit on int() from a string (4,300 digits).
HUGE = "9" * 5000
#: A bad value of 90 KB.
LONG = "x," * 45_000


def _run(
    code: str, *args: str, env_vars: dict[str, str], flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    base.pop("RANK", None)
    return subprocess.run(
        [sys.executable, *flags, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**base, **env_vars},
    )


def _said(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught]


# --- 4: a number too long for int() -----------------------------------------------------------

_RECORD = """
from mstx_marks import mark
for _ in range(3):
    with mark("step"):
        pass
"""


@pytest.mark.parametrize("variable", [env.RECORD_CAPACITY, "RANK"])
def test_a_5000_digit_number_is_refused_and_the_job_still_records(
    tmp_path: Path, variable: str
) -> None:
    proc = _run(_RECORD, env_vars={variable: HUGE, env.OUT: str(tmp_path)}, flags=("-W", "error"))
    assert proc.returncode == 0, proc.stderr
    assert "Exceeds the limit" not in proc.stderr and "activation" not in proc.stderr
    said = [line for line in proc.stderr.splitlines() if f"ignoring {variable}=" in line]
    assert len(said) == 1 and "at most 18 digits" in said[0], proc.stderr
    assert len(said[0]) < 400  # the value is cut
    (spill,) = (tmp_path / "spill").glob("*.jsonl")
    trace = read_spill(spill)
    assert [r.name for r in trace.records] == ["step"] * 3 and trace.rank == 0


def test_counts_take_leading_zeros_and_refuse_what_an_int64_cannot_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(env.RECORD_CAPACITY, "000123")
    monkeypatch.setenv("RANK", "0" * 5000 + "7")  # long, but a small number
    assert env.positive_int(env.RECORD_CAPACITY, 5) == 123 and env.rank() == 7
    monkeypatch.setenv(env.RECORD_CAPACITY, "1" + "0" * 18)  # 19 digits
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert env.positive_int(env.RECORD_CAPACITY, 5) == 5
    assert len(w) == 1


# --- 5: every echoed value is cut -------------------------------------------------------------


def test_every_message_of_the_environment_readers_cuts_the_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mstx_marks.launch.activate import parse_instrument, parse_samples

    monkeypatch.setenv(env.DISABLE, LONG)
    monkeypatch.setenv(env.RECORD_CAPACITY, LONG)
    monkeypatch.setenv("RANK", LONG)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        env.flag(env.DISABLE)
        env.positive_int(env.RECORD_CAPACITY, 1)
        env.rank()
        parse_instrument(LONG)
        parse_samples(LONG.replace(",", ";"))
    said = _said(w)
    assert len(said) >= 5
    assert all(len(s) < 600 and "(90000 characters)" in s for s in said), [len(s) for s in said]


def test_a_90_kb_value_costs_a_line_not_90_kb_of_stderr(tmp_path: Path) -> None:
    bad = {v: LONG for v in (env.DISABLE, env.RECORD_CAPACITY, env.RECORD_NAMES, "RANK")}
    proc = _run(_RECORD, env_vars={**bad, env.OUT: str(tmp_path), env.INSTRUMENT: LONG})
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stderr) < 5000, len(proc.stderr)
    for variable in bad:
        assert f"ignoring {variable}=" in proc.stderr, variable


def test_quoted_is_the_one_helper() -> None:
    """activate.py's own cutter is gone: one home, env.quoted."""
    import mstx_marks.launch.activate as activate

    assert not hasattr(activate, "_quoted")
    assert env.quoted("a" * 200, limit=10) == "'aaaaaaaaaa'... (200 characters)"


# --- 6: a mistyped name with our prefix -------------------------------------------------------

TYPO = env.OUT + "PUT"  # MSTX_MARKS_OUTPUT


def test_a_mistyped_name_warns_once_at_activation_with_the_closest_name(tmp_path: Path) -> None:
    proc = _run(_RECORD, env_vars={TYPO: str(tmp_path), env.OUT: str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if TYPO in line]
    assert len(said) == 1, proc.stderr
    assert f"did you mean {env.OUT}?" in said[0]


def test_a_mistyped_name_alone_is_said_by_the_activation_of_a_launched_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import mstx_marks.launch.activate as activate

    monkeypatch.setenv(env.PREFIX + "INSTRUMNET", "verl")
    monkeypatch.setattr(activate, "_done_in", None)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        activate.activate()
    assert _said(w) == [
        f"mstx_marks: ignoring {env.PREFIX}INSTRUMNET: mstx_marks has no variable of that name;"
        f" did you mean {env.INSTRUMENT}?"
    ]


def test_the_doctor_stops_at_a_mistyped_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from mstx_marks.cli.doctor import diagnose

    monkeypatch.setenv(TYPO, "prof")
    found = [f for f in diagnose() if TYPO in f.text]
    assert len(found) == 1 and found[0].level == "stop"
    assert f"did you mean {env.OUT}?" in found[0].text


def test_a_name_with_nothing_close_lists_the_known_ones() -> None:
    (said,) = env.unknown_names([env.PREFIX + "ZZZZZZZZ"])
    assert "known: " + ", ".join(v.name for v in env.VARIABLES) in said


def test_thousands_of_unknown_presets_are_one_warning_naming_the_first_few() -> None:
    from mstx_marks.launch.activate import parse_instrument

    text = ",".join(f"a{i}" for i in range(3000))  # each distinct: each was its own warning
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert parse_instrument(text + ",verl") == ("verl",)
    (said,) = _said(w)
    assert len(said) < 800, len(said)
    assert "ignoring 'a0': unknown framework 'a0'" in said
    assert "also unknown: 'a1', 'a2', 'a3', 'a4', 'a5' (and 2994 more)" in said
