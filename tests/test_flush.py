"""flush_at_exit: a process's recording written at exit and on SIGTERM/SIGINT; asking for files
means recording; an empty recording says why and never replaces one that held ranges."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import mstx_marks
from mstx_marks.backends.record import Recorder
from mstx_marks.export import chrome_trace_path, flush_at_exit, read_ascend_db, read_chrome_trace
from mstx_marks.export.out import process_role


@pytest.fixture(autouse=True)
def _no_exit_hooks(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The in-process tests call their flush themselves; their exit hooks would run when pytest
    ends, long after the test's files and settings are gone."""
    import types

    registered: list[object] = []
    fake = types.SimpleNamespace(register=registered.append)
    monkeypatch.setattr("mstx_marks.export.out.atexit", fake)
    return registered


_STOPPED_WORKER = """
import sys, time
from mstx_marks.backends.record import default_recorder
from mstx_marks.export import flush_at_exit
rec = default_recorder()
flush_at_exit(sys.argv[1], rank=4)
for _ in range(3):
    rec.range_end(rec.range_start("update_actor", "default"), "default")
rec.range_start("never_ended", "default")
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_worker_loses_nothing_it_recorded(tmp_path: Path, signum: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _STOPPED_WORKER, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signum)
    proc.wait(timeout=30)
    # The handler that was there before still runs: SIGTERM kills, SIGINT raises
    # KeyboardInterrupt (and Python then exits by SIGINT too).
    assert proc.returncode == -signum
    assert proc.stderr is not None
    assert ("KeyboardInterrupt" in proc.stderr.read()) == (signum == signal.SIGINT)
    (db,) = tmp_path.glob("ascend/*/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_4.db")
    # The range still open at the signal is exported too, ended at the flush.
    assert [r.name for r in read_ascend_db(db).ranges] == ["update_actor"] * 3 + ["never_ended"]
    # named as MSTX_MARKS_OUT names its files: role ("python -c" is "main"), rank, host, pid
    host = socket.gethostname()
    names = [p.name for p in (tmp_path / "chrome").iterdir()]
    assert names == [f"main-rank4-{host}-{proc.pid}.trace.json"]
    # the spill was written first (what a grace period ending mid-export would have left)
    from mstx_marks.export.spill import read_spill

    (spilled,) = (tmp_path / "spill").iterdir()
    trace = read_spill(spilled)
    assert trace.rank == 4
    assert [(r.name, r.open) for r in trace.ranges] == [("update_actor", False)] * 3 + [
        ("never_ended", True)
    ]


_SIGNALLED_DURING_FLUSH = """
import os, signal, sys
from mstx_marks.backends.record import Recorder
from mstx_marks.export import flush_at_exit

class SignalledMidFlush(Recorder):
    sent = False

    def open_ranges(self, cursor):  # called inside the flush's final spill, under its lock
        if not self.sent:  # SIGTERM lands while the explicit flush below holds its lock
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)
        return super().open_ranges(cursor)

rec = SignalledMidFlush()
rec.range_end(rec.range_start("update_actor", "default"), "default")
flush = flush_at_exit(sys.argv[1], rank=0, recorder=rec, signals=(signal.SIGTERM,))
flush()
print("survived SIGTERM", flush=True)
"""


def test_a_signal_during_a_flush_neither_hangs_nor_loses_the_recording(tmp_path: Path) -> None:
    # The handler flushes again from inside the interrupted flush, on the same thread: with a
    # plain lock it waited on itself forever (the timeout only turns that hang into a failure).
    proc = subprocess.run(
        [sys.executable, "-c", _SIGNALLED_DURING_FLUSH, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    (db,) = tmp_path.glob("ascend/*/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_0.db")
    assert [r.name for r in read_ascend_db(db).ranges] == ["update_actor"]


_TWO_SIGNALS = """
import os, signal, sys, threading, time
from mstx_marks.backends.record import Recorder
from mstx_marks.export import flush_at_exit

flushes = []

class Slow(Recorder):
    def open_ranges(self, cursor):  # once per flush (its final spill)
        flushes.append(1)
        sys.stderr.write(f"flush {len(flushes)}\\n")
        if len(flushes) == 1:  # a second SIGTERM arrives while the first one's flush runs
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
        return super().open_ranges(cursor)

def user_handler(num, frame):  # installed before ours: still runs, once, after the flush
    sys.stderr.write("user handler\\n")
    sys.exit(3)

signal.signal(signal.SIGTERM, user_handler)
rec = Slow()
rec.range_end(rec.range_start("update_actor", "default"), "default")
flush_at_exit(sys.argv[1], rank=0, recorder=rec, signals=(signal.SIGTERM,))
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
"""


def test_a_second_signal_does_not_restart_the_flush_and_handlers_chain(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _TWO_SIGNALS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # one flush from the signal; the atexit flush after sys.exit(3) is the second
    lines = proc.stderr.splitlines()
    assert lines[:2] == ["flush 1", "user handler"], proc.stderr
    assert proc.returncode == 3
    (db,) = tmp_path.glob("ascend/*/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_0.db")
    assert [r.name for r in read_ascend_db(db).ranges] == ["update_actor"]
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]


def test_what_a_killed_writer_left_is_removed_by_the_next_write(tmp_path: Path) -> None:
    from mstx_marks.export.files import atomic_write_bytes

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    target = tmp_path / "rank0.trace.json"
    stale = [
        tmp_path / f".rank0.trace.json.{dead}.abc.tmp",
        tmp_path / f".rank0.trace.json.{dead}.abc.tmp-journal",
    ]
    mine = tmp_path / f".rank0.trace.json.{os.getpid()}.live.tmp"  # a writer still running
    for p in [*stale, mine]:
        p.write_bytes(b"half")
    atomic_write_bytes(target, b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, mine.name])


def test_chrome_trace_and_database_are_replaced_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mstx_marks.base.records import RangeRecord, RankTrace
    from mstx_marks.export import process_files as flush_module

    first = RankTrace(0, [RangeRecord("first", "default", 1, 2, 1, 1)])
    paths = flush_module.export_rank(tmp_path, first)

    def broken_db(path: object, trace: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(flush_module, "write_ascend_db", broken_db)
    second = RankTrace(0, [RangeRecord("second", "default", 1, 2, 1, 1)])
    with pytest.raises(OSError, match="disk full"):
        flush_module.export_rank(tmp_path, second, db_path=paths[1])
    # the Chrome trace was written but not put in place: both files still hold the first flush
    assert [r.name for r in read_chrome_trace(paths[0])[0].ranges] == ["first"]
    assert [r.name for r in read_ascend_db(paths[1]).ranges] == ["first"]
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]


def test_asking_for_files_means_recording(tmp_path: Path) -> None:
    """On CPU the default backend records nothing; flush_at_exit must turn recording on."""
    flush = flush_at_exit(tmp_path, rank=0, signals=())
    assert mstx_marks.recording()
    with mstx_marks.mark("step"):
        pass
    chrome, db = flush()
    assert [r.name for r in read_ascend_db(db).ranges] == ["step"]
    assert [r.name for r in read_chrome_trace(chrome)[0].ranges] == ["step"]


def test_an_empty_recording_says_why_and_keeps_what_was_written(tmp_path: Path) -> None:
    rec = Recorder()
    flush = flush_at_exit(tmp_path, rank=0, recorder=rec, signals=())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert flush() == []  # nothing recorded yet: nothing written, and it says why
    assert len(w) == 1 and "recorded no ranges" in str(w[0].message)
    assert "no range or instant was recorded into the recorder given" in str(w[0].message)
    rec.range_end(rec.range_start("step", "default"), "default")
    written = flush()
    rec.clear()
    again = flush()  # the recorder holds nothing new: the files keep what the spill holds
    assert again == written
    assert [r.name for r in read_ascend_db(written[1]).ranges] == ["step"]


def test_an_empty_recording_names_the_reason(tmp_path: Path) -> None:
    mstx_marks.configure(enabled=False)
    flush = flush_at_exit(tmp_path, rank=0, signals=())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        flush()
    assert "ranges are disabled" in str(w[0].message)


def test_the_rank_comes_from_torch_distributed_when_rank_is_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    fake = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                 get_rank=lambda: 5)  # fmt: skip
    monkeypatch.setitem(sys.modules, "torch.distributed", fake)  # a stand-in: no process group
    flush = flush_at_exit(tmp_path, signals=())
    with mstx_marks.mark("step"):
        pass
    chrome, db = flush()
    assert chrome == chrome_trace_path(tmp_path, 5, role=process_role())
    assert read_ascend_db(db).rank == 5


_BOTH_WAYS = """
import sys
from mstx_marks import mark
from mstx_marks.export import flush_at_exit
flush_at_exit(sys.argv[1])  # beside MSTX_MARKS_OUT=sys.argv[2], set in the environment
with mark("step"):
    pass
"""


def test_flush_at_exit_names_its_files_as_mstx_marks_out_does(tmp_path: Path) -> None:
    """One process asking for files both ways writes the same names into both folders: one
    naming (role, rank, host, pid), whoever asked."""
    own, out = tmp_path / "own", tmp_path / "out"
    env = {**os.environ, "MSTX_MARKS_OUT": str(out), "MSTX_MARKS_ROLE": "trainer", "RANK": "2"}
    proc = subprocess.run(
        [sys.executable, "-c", _BOTH_WAYS, str(own), str(out)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr

    def names(folder: Path) -> list[str]:
        chrome = [p.name for p in (folder / "chrome").iterdir()]
        # a database folder is <worker>_<time>_ascend_pt: the worker, less the time
        dbs = [p.parent.parent.name.rsplit("_", 3)[0] for p in folder.glob("ascend/*/*/*.db")]
        return chrome + dbs

    host = socket.gethostname()
    assert names(own) == names(out)
    assert names(own)[0].startswith(f"trainer-rank2-{host}-")
    assert names(own)[1].startswith(f"trainer_{host}_")
    for folder in (own, out):
        (db,) = folder.glob("ascend/*/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_2.db")
        assert [r.name for r in read_ascend_db(db).ranges] == ["step"]


@pytest.mark.parametrize("how", ["flush_at_exit", "MSTX_MARKS_OUT"])
def test_each_flush_rewrites_one_database_rather_than_adding_folders(
    tmp_path: Path, how: str
) -> None:
    from mstx_marks.export.out import record_to

    if how == "flush_at_exit":
        flush = flush_at_exit(tmp_path, rank=0, signals=())
    else:
        flush = record_to(tmp_path, interval=None, signals=()).flush
    for _ in range(3):
        with mstx_marks.mark("step"):
            pass
        chrome, db = flush()
    assert len(list(tmp_path.glob("ascend/*_ascend_pt"))) == 1
    assert [p.name for p in (tmp_path / "chrome").iterdir()] == [chrome.name]
    assert [r.name for r in read_ascend_db(db).ranges] == ["step"] * 3
