"""Issue 37, item 3: every file a process writes under ``MSTX_MARKS_OUT`` has a name that starts
with a letter or a digit: ``ls``, ``rm`` and ``cp`` take a name starting with ``-`` for an
option. A program read from standard input (``python - <<EOF``, whose ``sys.argv[0]`` is ``-``)
is the ``stdin`` role (mstx_marks/export/out.py ``process_role``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mstx_marks.base import env
from mstx_marks.export import read_chrome_trace
from mstx_marks.export.out import process_role

PROGRAM = """
from mstx_marks import mark
with mark("step"):
    pass
"""


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*"))


@pytest.mark.parametrize(
    ("argv", "role", "expected"),
    [
        (["-"], None, "stdin"),  # python - <<EOF
        (["-"], "-rollout", "rollout"),  # a role given with a leading dash
    ],
)
def test_every_file_name_starts_with_a_letter_or_a_digit(
    tmp_path: Path, argv: list[str], role: str | None, expected: str
) -> None:
    out = tmp_path / "prof"
    base = {k: v for k, v in os.environ.items() if not k.startswith(env.PREFIX)}
    extra = {env.OUT: str(out), **({env.ROLE: role} if role else {})}
    proc = subprocess.run(
        [sys.executable, *argv],
        input=PROGRAM,
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **extra},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    names = _names(out)
    assert any(n.endswith(".trace.json") for n in names), names
    assert all(n[0].isascii() and n[0].isalnum() for n in names), names
    (chrome,) = out.glob("chrome/*.trace.json")
    assert chrome.name.startswith(f"{expected}-rank0-")
    (trace,) = read_chrome_trace(chrome)
    assert trace.role == expected and [r.name for r in trace.records] == ["step"]


@settings(max_examples=80, deadline=None)
@given(
    role=st.text(
        st.characters(codec="utf-8", exclude_characters="\x00"),  # what environ can hold
        min_size=1,
        max_size=20,
    ).filter(lambda r: r.strip() == r and r)
)
def test_a_role_always_starts_with_a_letter_or_a_digit(role: str) -> None:
    saved = os.environ.get(env.ROLE)
    os.environ[env.ROLE] = role
    try:
        got = process_role()
    finally:
        if saved is None:
            os.environ.pop(env.ROLE, None)
        else:
            os.environ[env.ROLE] = saved
    assert got[0].isascii() and got[0].isalnum(), got
    assert got == "main" or role.endswith(got)  # only leading characters are dropped
