"""Issue 27, the edges a long job meets at its output folder (mstx_marks/export/out.py, spill.py,
launch/activate.py): a relative folder and a program that changes directory, a folder removed
while the job runs, a folder that cannot be written. Each runs the program as a user would and
reads back every file it wrote."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
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


@pytest.mark.parametrize("where", ["under a file", "/proc"])
def test_a_folder_that_cannot_be_made_is_one_plain_line_before_user_code(
    tmp_path: Path, where: str
) -> None:
    """Issue 37: said once, at activation, with why, and nothing recorded: no second line at
    exit about events that were never going to be written. /proc as root: access() says yes,
    but no folder can be made there."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    out, why = (
        (blocker / "prof", f"{blocker} is a file")
        if where == "under a file"
        else (Path("/proc/mstx_marks_nope"), "/proc takes no new folders")
    )
    proc = _run(_UNWRITABLE, env={"MSTX_MARKS_OUT": str(out)})
    assert proc.returncode == 0, proc.stderr  # user code unharmed
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "mstx_marks:" in line]
    assert len(lines) == 1, proc.stderr
    (line,) = lines
    assert line.endswith(
        f"mstx_marks: cannot write {out}: {why}: nothing is recorded or written for"
        " MSTX_MARKS_OUT in this process"
    ), line
    assert proc.stderr.index(line) < proc.stderr.index("user code starts")
    assert not out.exists()


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


@pytest.mark.parametrize("where", ["under a file", "/proc"])
def test_run_refuses_an_out_folder_that_cannot_be_written_before_starting(
    tmp_path: Path, where: str
) -> None:
    """/proc as root (issue 37): access() says yes; making the folder says no."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    out, why = (
        (blocker / "prof", f"{blocker} is a file")
        if where == "under a file"
        else (Path("/proc/nope"), "/proc takes no new folders")
    )
    marker = tmp_path / "started"
    base = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    proc = subprocess.run(
        [sys.executable, "-m", "mstx_marks", "run", "--out", str(out), "--", *command],
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert not marker.exists()  # nothing was started
    assert proc.stderr.splitlines() == [f"error: nothing was started: cannot write {out}: {why}"]


_AS_NOBODY = """
import os, sys
from mstx_marks.export.out import cannot_write  # first: nobody may not read root's packages
if os.getuid() == 0:  # root writes any folder: drop to nobody, as a user without the right
    os.setgid(65534)
    os.setuid(65534)
print(cannot_write(sys.argv[1]))
"""


def test_cannot_write_names_a_read_only_or_forbidden_folder(tmp_path: Path) -> None:
    """Decided by making the folder and writing there, so root (our machines, CI, most
    containers) meets each case too: /proc takes no folder whatever access() tells root, and a
    folder without write permission is met by dropping to nobody."""
    from mstx_marks.export.out import cannot_write

    assert cannot_write("/proc/mstx_marks_nope/prof") == (
        "cannot write /proc/mstx_marks_nope/prof: /proc takes no new folders"
    )
    base = Path(tempfile.mkdtemp())
    try:
        base.chmod(0o755)  # nobody may look in, not write
        locked = base / "locked"
        locked.mkdir(mode=0o555)
        proc = _run(_AS_NOBODY, str(locked / "prof"))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == (
            f"cannot write {locked / 'prof'}: permission denied (in {locked})"
        )
    finally:
        shutil.rmtree(base)
    new = tmp_path / "new" / "deeper"
    assert cannot_write(new) is None
    assert new.is_dir() and not list(new.iterdir())  # made, and the probe file removed


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
        out.rmdir()  # made when asked for (its probe); now a file where it goes:
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
    ("error", "reason"),
    [
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "permission denied"),
        (errno.ENOSPC, "no space left on the device"),
    ],
)
def test_cannot_write_says_why_a_folder_refuses_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int, reason: str
) -> None:
    """What the file system answers the probe, in words: whether the folder itself refuses
    its probe file, or the folder above refuses the new folder. os.access is never asked
    (it says yes to root): the machine's own answer is faked here."""
    from mstx_marks.export.out import cannot_write

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(os, "access", lambda *args, **kwargs: True)  # as root sees it
    monkeypatch.setattr(os, "mkdir", refuse)
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert cannot_write(tmp_path) == f"cannot write {tmp_path}: {reason}"
    assert (
        cannot_write(tmp_path / "a" / "b")
        == f"cannot write {tmp_path / 'a' / 'b'}: {reason} (in {tmp_path})"
    )
