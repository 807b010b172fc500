"""Issue 27, the edges a long job meets at its output folder (mstx_marks/export/out.py, spill.py,
launch/activate.py): a relative folder and a program that changes directory, a folder removed
while the job runs, a folder that cannot be written. Each runs the program as a user would and
reads back every file it wrote."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from mstx_marks.base import diagnostics
from mstx_marks.export import read_ascend_db, read_chrome_trace
from mstx_marks.export.spill import Spill, read_spill


def _run(
    code: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**base, **(env or {})},
        cwd=cwd,
    )


def _every_file(folder: Path) -> dict[str, list[str]]:
    """Each file's range names, by kind: the spill, the Chrome trace, the database."""
    out: dict[str, list[str]] = {}
    for p in sorted(folder.rglob("*.jsonl")):
        out["spill"] = sorted(r.name for r in read_spill(p).records)
    for p in sorted(folder.rglob("*.trace.json")):
        out["chrome"] = sorted(r.name for r in read_chrome_trace(p)[0].records)
    for p in sorted(folder.rglob("*.db")):
        out["db"] = sorted(r.name for r in read_ascend_db(p).records)
    return out


# --- 1: a relative folder, and a program that changes directory ------------------------------

_MOVES = """
import os, subprocess, sys
import mstx_marks  # MSTX_MARKS_OUT is set: activated at import
from mstx_marks import mark
os.chdir(sys.argv[1])
with mark("after_chdir"):
    pass
child = "import os; print(os.environ['MSTX_MARKS_OUT'])"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
"""


def test_a_relative_out_folder_is_resolved_once_and_children_inherit_it(tmp_path: Path) -> None:
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    proc = _run(_MOVES, str(elsewhere), env={"MSTX_MARKS_OUT": "prof"}, cwd=start)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(start / "prof")  # what a child reads: absolute
    assert not (elsewhere / "prof").exists()
    files = _every_file(start / "prof")
    assert files == {k: ["after_chdir"] for k in ("spill", "chrome", "db")}, files


_FLUSH_MOVES = """
import os, sys
from mstx_marks import mark
from mstx_marks.export import flush_at_exit
flush_at_exit("out")  # README's own program, relative
os.chdir(sys.argv[1])
with mark("after_chdir"):
    pass
"""


def test_flush_at_exit_of_a_relative_folder_writes_where_it_was_asked(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = _run(_FLUSH_MOVES, str(elsewhere), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (elsewhere / "out").exists()
    files = _every_file(tmp_path / "out")
    assert files == {k: ["after_chdir"] for k in ("spill", "chrome", "db")}, files


def test_the_launcher_hands_an_absolute_out_folder_to_the_job(tmp_path: Path) -> None:
    code = "import os; print(os.environ['MSTX_MARKS_OUT'])"
    base = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    proc = subprocess.run(
        [sys.executable, "-m", "mstx_marks", "run", "--", sys.executable, "-c", code],
        env={**base, "MSTX_MARKS_OUT": "prof"},  # from the environment, not --out
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "prof")


# --- 2: the folder removed while the job runs -------------------------------------------------

_REMOVED = """
import shutil, sys
from mstx_marks import mark
from mstx_marks.export.out import record_to
session = record_to(sys.argv[1])
for _ in range(3):
    with mark("before"):
        pass
session.write_now()  # spilled, as the periodic spill would have
shutil.rmtree(sys.argv[1])  # rm -rf while the job runs
for _ in range(2):
    with mark("after"):
        pass
"""


def test_a_folder_removed_while_the_job_runs_is_made_again_with_everything(
    tmp_path: Path,
) -> None:
    out = tmp_path / "prof"
    proc = _run(_REMOVED, str(out))
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "was removed" in line]
    assert len(said) == 1 and str(out) in said[0] and "3 events" in said[0], proc.stderr
    expected = ["after"] * 2 + ["before"] * 3
    files = _every_file(out)
    assert files == {k: expected for k in ("spill", "chrome", "db")}, files


def test_a_removed_spill_whose_content_cannot_be_copied_says_what_was_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mstx_marks.backends.record import Recorder

    rec = Recorder()
    spill = Spill(tmp_path / "out", rec, rank=0)
    rec.range_end(rec.range_start("before", "d"), "d")
    spill.write_now()
    shutil.rmtree(tmp_path / "out")
    real_open = open

    def no_proc(path: object, *args: object, **kwargs: object) -> object:
        if str(path).startswith("/proc/self/fd/"):
            raise FileNotFoundError(path)  # as on a system without /proc
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", no_proc)
    rec.range_end(rec.range_start("after", "d"), "d")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        path = spill.write_now()
    monkeypatch.undo()
    assert [str(x.message) for x in w] == [
        f"mstx_marks: {tmp_path / 'out'} was removed while the job ran: made again;"
        " the 1 events spilled before are lost"
    ]
    assert [r.name for r in read_spill(path).records] == ["after"]
    assert spill.lost == 1


# --- 3: a folder that cannot be written -------------------------------------------------------

_UNWRITABLE = """
import sys
import mstx_marks  # MSTX_MARKS_OUT is set: activated at import
print("user code starts", file=sys.stderr, flush=True)
for _ in range(3):
    with mstx_marks.mark("step"):
        pass
"""


def test_a_folder_that_cannot_be_written_is_said_at_activation_and_what_is_lost_at_exit(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    out = blocker / "prof"
    proc = _run(_UNWRITABLE, env={"MSTX_MARKS_OUT": str(out)})
    assert proc.returncode == 0, proc.stderr  # user code unharmed
    lines = [line for line in proc.stderr.splitlines() if "mstx_marks:" in line]
    assert "cannot be read" not in proc.stderr and "Traceback" not in proc.stderr
    assert len(lines) == 2, proc.stderr
    first, last = lines
    # At activation, before any user code, naming the folder and why.
    assert f"cannot write {out}: {blocker} is a file" in first
    assert proc.stderr.index(first) < proc.stderr.index("user code starts")
    # At exit: exactly what was lost.
    assert f"cannot write {out}:" in last and "3 of the 3 events recorded are in no file" in last


def test_a_folder_that_refuses_the_first_spill_is_named_then_written_when_it_can(
    tmp_path: Path,
) -> None:
    """Writable when asked for, refused later: said at the first failed write (not at exit),
    once, and nothing is lost once the folder takes writes again."""
    from mstx_marks.backends.record import Recorder

    out = tmp_path / "out"
    rec = Recorder()
    spill = Spill(out, rec, rank=0)
    out.write_text("")  # a file where the folder goes
    rec.range_end(rec.range_start("a", "d"), "d")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(2):
            with pytest.raises(OSError):
                spill.write_now()
    assert len(w) == 1 and str(w[0].message).startswith(f"mstx_marks: cannot write {out}: ")
    with spill.on_disk() as (alone, extra):  # read from memory, through a file of its own
        assert alone is not None and alone.parent != out.parent / "spill"
        assert spill.unwritten == 1 and read_spill(alone, extra=extra).records[0].name == "a"
    out.unlink()
    rec.range_end(rec.range_start("b", "d"), "d")
    path = spill.write_now()
    assert [r.name for r in read_spill(path).records] == ["a", "b"]
    assert spill.unwritten == 0 and spill.failure is None


def test_lines_that_wait_past_the_limit_are_counted_as_lost_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mstx_marks.backends.record import Recorder
    from mstx_marks.export import spill as spill_module

    monkeypatch.setattr(spill_module, "_MAX_PENDING", 10)  # any event's lines are past it
    out = tmp_path / "out"
    rec = Recorder()
    spill = Spill(out, rec, rank=0)
    out.write_text("")
    diagnostics.forget_warnings()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(2):
            rec.range_end(rec.range_start("a", "d"), "d")
            with pytest.raises(OSError):
                spill.write_now()
    said = [str(x.message) for x in w if "lost" in str(x.message)]
    assert spill.lost == 2 and spill.unwritten == 2  # both given up, counted
    assert len(said) == 1 and "1 events waited past" in said[0], said  # said at the first


def test_run_refuses_an_out_folder_that_cannot_be_written_before_starting(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    marker = tmp_path / "started"
    base = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    proc = subprocess.run(
        [sys.executable, "-m", "mstx_marks", "run", "--out", str(blocker / "prof"), "--", *command],
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert not marker.exists()  # nothing was started
    assert proc.stderr.splitlines() == [
        f"error: nothing was started: cannot write {blocker / 'prof'}: {blocker} is a file"
    ]


def test_cannot_write_names_a_read_only_or_forbidden_folder(tmp_path: Path) -> None:
    from mstx_marks.export.out import cannot_write

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    if os.access(locked, os.W_OK):
        pytest.skip("this user writes any folder (root)")
    assert cannot_write(locked / "prof") == (
        f"cannot write {locked / 'prof'}: permission denied (in {locked})"
    )
    assert cannot_write(tmp_path / "new" / "deeper") is None  # made when first written


def test_events_lost_while_the_folder_refused_them_are_counted_at_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mstx_marks.backends.record import Recorder
    from mstx_marks.export import spill as spill_module
    from mstx_marks.export.out import OutSession

    monkeypatch.setattr(spill_module, "_MAX_PENDING", 10)
    out = tmp_path / "out"
    rec = Recorder()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        session = OutSession(out, None, recorder=rec, rank=0)
        out.write_text("")  # refused from here on
        for name in ("lost_1", "lost_2"):
            rec.range_end(rec.range_start(name, "d"), "d")
            session.write_now()  # never raises; the spill says it
        out.unlink()  # writable again
        rec.range_end(rec.range_start("kept", "d"), "d")
        written = session.close()
    said = [str(x.message) for x in w]
    assert (
        said[-1]
        == f"mstx_marks: 2 of the 3 events recorded are in no file: {out} refused them for too long"
    )
    assert _every_file(out) == {k: ["kept"] for k in ("spill", "chrome", "db")}
    assert len(written) == 3


@pytest.mark.parametrize(
    ("read_only", "reason"), [(True, "read-only file system"), (False, "permission denied")]
)
def test_cannot_write_says_why_a_folder_refuses_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_only: bool, reason: str
) -> None:
    """As a user without write access sees it (root passes os.access: faked here)."""
    from types import SimpleNamespace

    from mstx_marks.export.out import cannot_write

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setattr(
        os, "statvfs", lambda path: SimpleNamespace(f_flag=os.ST_RDONLY if read_only else 0)
    )
    assert cannot_write(tmp_path) == f"cannot write {tmp_path}: {reason}"
    assert (
        cannot_write(tmp_path / "a" / "b")
        == f"cannot write {tmp_path / 'a' / 'b'}: {reason} (in {tmp_path})"
    )
