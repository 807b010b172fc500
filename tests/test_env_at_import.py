"""Issue 37, item 1: a mistyped ``MSTX_MARKS_*`` variable is said on ``import mstx_marks``, once,
with the closest known name, whatever else is set (mstx_marks/base/env.py's one rule, run by the
package's import and again by activation for a name set later)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mstx_marks.base import diagnostics, env

TRAIN = """
import sys
import mstx_marks
print("difflib" in sys.modules)
with mstx_marks.mark("step"):
    pass
"""


def _train(tmp_path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    base = {k: v for k, v in os.environ.items() if not k.startswith(env.PREFIX)}
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **variables},
        cwd=tmp_path,
    )


def test_a_misspelled_variable_alone_is_said_at_import(tmp_path: Path) -> None:
    proc = _train(tmp_path, MSTX_MARKS_OUTPUT="run3")  # meant: MSTX_MARKS_OUT
    assert proc.returncode == 0, proc.stderr
    line, source = proc.stderr.splitlines()  # the warning, and the user's line it names
    assert source.strip() == "import mstx_marks", proc.stderr
    assert line.endswith(
        "mstx_marks: ignoring MSTX_MARKS_OUTPUT: mstx_marks has no variable of that name;"
        " did you mean MSTX_MARKS_OUT?"
    ), line
    # at the user's `import mstx_marks` (line 3 of train.py), not `sys:1`
    assert line.startswith(f"{tmp_path / 'train.py'}:3: MstxMarksWarning"), line
    assert not (tmp_path / "run3").exists()


def test_beside_a_variable_that_activates_it_is_said_once(tmp_path: Path) -> None:
    """The import says it, and activation (which checks names set after the import) does not
    say it again."""
    proc = _train(tmp_path, MSTX_MARKS_OUT=str(tmp_path / "prof"), MSTX_MARKS_SAMPEL="x")
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "MSTX_MARKS_SAMPEL" in line]
    assert len(said) == 1 and said[0].endswith("did you mean MSTX_MARKS_SAMPLE?"), proc.stderr


def test_known_names_cost_no_import_and_say_nothing(tmp_path: Path) -> None:
    proc = _train(tmp_path, MSTX_MARKS_BACKEND="record", MSTX_MARKS_RUN="r1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.split() == ["False"]  # difflib is imported only for an unknown name


NAMES = st.lists(
    st.one_of(
        st.sampled_from([v.name for v in env.VARIABLES]),
        st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=12).map(env.PREFIX.__add__),
        st.sampled_from(["PATH", "HOME", "MSTX_MARK_OUT"]),  # not our prefix: never ours to say
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(NAMES, min_size=1, max_size=4))
def test_each_unknown_name_is_said_once_per_process_however_often_it_is_checked(
    calls: list[list[str]],
) -> None:
    known = {v.name for v in env.VARIABLES}
    diagnostics.forget_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for names in calls:
            env.say_unknown_names(names)
    said = [str(w.message).split()[2].rstrip(":") for w in caught]
    unknown = {n for names in calls for n in names if n.startswith(env.PREFIX) and n not in known}
    assert sorted(said) == sorted(unknown)  # each once, none of the known, none without prefix
    diagnostics.forget_warnings()
