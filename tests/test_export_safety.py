"""``mstx-marks export DIR`` on a shared output folder, run through the real command: links
planted under ``DIR`` are never followed (to read, write or remove) and the files they point to
stay as they were; an empty or unreadable spill is said and the others are exported; a target
that cannot be written is one line and exit status 2; a process exported while it runs, then
by itself, keeps one database folder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mstx_marks.backends.record import Recorder
from mstx_marks.export.ascend_db import read_ascend_db
from mstx_marks.export.chrome import read_chrome_trace
from mstx_marks.export.spill import Spill
from mstx_marks.export.stream import export_spill


def _spill(out: Path, names: tuple[str, ...] = ("update_actor", "compute_score")) -> Path:
    """A process's spill in ``out`` (as a Ray worker leaves it: nothing else)."""
    rec = Recorder()
    for name in names:
        rec.range_end(rec.range_start(name, "verl"), "verl")
    return Spill(out, rec, rank=0, role="Worker").write_now(final=True)


def _export(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    return subprocess.run(
        [sys.executable, "-m", "mstx_marks", "export", str(folder), *args],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip


def _victim(tmp: Path) -> Path:
    """Someone's files outside DIR: a database where a process's would go, and a trace."""
    victim = tmp / "victim"
    (victim / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (victim / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_7.db").write_bytes(b"keep")
    (victim / "profiler_info_7.json").write_text("{}")
    (victim / "mine.trace.json").write_text("[]")
    return victim


def _state(folder: Path) -> dict[str, object]:
    """Every name under ``folder`` with its bytes and modification time (folders: None)."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


def test_links_planted_under_the_folder_are_never_followed(tmp_path: Path) -> None:
    out = tmp_path / "shared"
    spill = _spill(out)
    host, _, pid = spill.stem.rpartition("-")
    victim = _victim(tmp_path)
    before = _state(victim)
    # The process's database folder and an old Chrome trace of it, as links to the victim's.
    (out / "ascend").mkdir()
    (out / "ascend" / f"Worker_{host}_{pid}_20250101000000000_ascend_pt").symlink_to(victim)
    (out / "chrome").mkdir()
    (out / "chrome" / f"Worker-rank7-{spill.stem}.trace.json").symlink_to(
        victim / "mine.trace.json"
    )

    done = _export(out)
    assert done.returncode == 0, done.stderr
    assert _state(victim) == before
    written = [Path(line) for line in done.stdout.splitlines()]
    assert len(written) == 2 and all(out.resolve() in p.resolve().parents for p in written)
    assert not any(p.is_symlink() for path in written for p in [path, *path.parents])
    assert "is a link: not followed" in done.stderr and "Traceback" not in done.stderr
    (trace,) = read_chrome_trace(written[0])
    assert sorted(r.name for r in trace.records) == ["compute_score", "update_actor"]
    assert len(read_ascend_db(written[1]).records) == 2
    again = _export(out, "--all")  # the same, with the links still there
    assert again.returncode == 0 and _state(victim) == before


@pytest.mark.parametrize("linked", ["chrome", "ascend"])
def test_a_linked_output_folder_refuses_the_export_in_one_line(tmp_path: Path, linked: str) -> None:
    out = tmp_path / "shared"
    _spill(out)
    victim = _victim(tmp_path)
    before = _state(victim)
    (out / linked).symlink_to(victim, target_is_directory=True)

    done = _export(out)
    assert done.returncode == 2 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"{out / linked}: it is a link" in errors[0], done.stderr
    assert "Traceback" not in done.stderr and "0 processes exported" in done.stderr
    assert _state(victim) == before


def test_a_spill_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    out = tmp_path / "shared"
    elsewhere = _spill(tmp_path / "private", ("secret_phase",))
    (out / "spill").mkdir(parents=True)
    (out / "spill" / "h-1.jsonl").symlink_to(elsewhere)
    done = _export(out)
    assert done.returncode == 0 and done.stdout == ""
    assert f"{out / 'spill' / 'h-1.jsonl'} is a link: not followed" in done.stderr
    assert not (out / "chrome").exists() and not (out / "ascend").exists()


def test_an_empty_or_unreadable_spill_does_not_stop_the_others(tmp_path: Path) -> None:
    out = tmp_path / "shared"
    good = _spill(out)
    (out / "spill" / "h-1.jsonl").write_bytes(b"")  # ended before its first write
    (out / "spill" / "h-2.jsonl").write_bytes(b"not a spill\n")
    done = _export(out)
    assert done.returncode == 2  # a process with events got no files
    lines = done.stderr.splitlines()
    assert f"note: {out / 'spill' / 'h-1.jsonl'} is empty" in done.stderr
    assert [line for line in lines if line.startswith("error:")] == [
        f"error: {out / 'spill' / 'h-2.jsonl'}: is not a mstx_marks spill file (no header"
        " line): not exported"
    ]
    chrome, db = (Path(line) for line in done.stdout.splitlines())
    assert chrome.name == f"Worker-rank0-{good.stem}.trace.json"
    assert len(read_ascend_db(db).records) == 2
    assert "1 process exported (3 had only a spill)" in done.stderr


def test_an_unwritable_target_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "shared"
    _spill(out)
    (out / "ascend").write_text("a file where the databases go")
    done = _export(out)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"{out / 'ascend'}: it is not a folder" in error
    assert not list((out / "chrome").glob("*.trace.json"))  # neither file: both or none


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only folders")
def test_a_read_only_folder_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "shared"
    _spill(out)
    (out / "chrome").mkdir(mode=0o500)
    try:
        done = _export(out)
    finally:
        (out / "chrome").chmod(0o700)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "Permission denied" in error


def test_a_process_exported_while_it_runs_keeps_one_database_folder(tmp_path: Path) -> None:
    """``export`` while the job runs, then the process's own exit write (which calls
    export_spill): one folder; the rank it learnt since replaces the old files."""
    out = tmp_path / "shared"
    spill = _spill(out)
    assert _export(out).returncode == 0
    (folder,) = (out / "ascend").iterdir()
    done = export_spill(out, spill, rank=5, process=spill.stem)  # its exit, knowing its rank
    assert [p.name for p in (out / "ascend").iterdir()] == [folder.name]
    assert done.paths[1] == folder / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_5.db"
    assert [p.name for p in (folder / "ASCEND_PROFILER_OUTPUT").iterdir()] == [done.paths[1].name]
    assert [p.name for p in (out / "chrome").iterdir()] == [f"Worker-rank5-{spill.stem}.trace.json"]
    assert _export(out, "--all").returncode == 0  # and again, the other way round
    assert [p.name for p in (out / "ascend").iterdir()] == [folder.name]
    assert socket.gethostname() in folder.name
