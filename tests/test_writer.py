"""The writer thread's contract (export/writer.py), through programs run as users run them and
the files they leave: the exit's files need no code of the main thread's, several sessions never
wait on each other at shutdown, a thread that records after the main thread ended is written,
and asking never blocks."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from mstx_marks.export.writer import Request, Writer


def _run(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,  # a shutdown that waits for ever would sit here
    )


def _db_names(folder: Path) -> list[str]:
    (db,) = folder.glob("ascend/*/ASCEND_PROFILER_OUTPUT/*.db")
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT s.value FROM MSTX_EVENTS e JOIN STRING_IDS s ON e.message = s.id"
        ).fetchall()
    return sorted(r[0] for r in rows)


def _chrome_names(folder: Path) -> list[str]:
    (trace,) = folder.glob("chrome/*.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted(e["name"] for e in events if e.get("ph") in ("X", "i"))


def test_two_sessions_and_a_thread_recording_after_main_are_all_written(tmp_path: Path) -> None:
    # The process's session and a private one (each its own writer, neither a daemon): the
    # shutdown waits for the user's thread, then for the writers, which must not wait for
    # each other; the user's thread's ranges, made after the main thread ended, are written.
    proc = _run(
        """
        import sys, threading, time
        from mstx_marks import mark, flush_at_exit
        from mstx_marks.backends.record import Recorder
        flush_at_exit(sys.argv[1])
        own = Recorder()
        flush_at_exit(sys.argv[2], recorder=own)
        own.range_end(own.range_start("own", "d"), "d")
        def late():
            time.sleep(0.3)
            for i in range(3):
                with mark(f"after_main_{i}"):
                    pass
        threading.Thread(target=late).start()
        with mark("in_main"):
            pass
        """,
        str(tmp_path / "a"),
        str(tmp_path / "b"),
    )
    assert proc.returncode == 0, proc.stderr
    expected = ["after_main_0", "after_main_1", "after_main_2", "in_main"]
    assert _db_names(tmp_path / "a") == expected
    assert _chrome_names(tmp_path / "a") == expected
    assert _db_names(tmp_path / "b") == ["own"]


def test_the_exit_is_written_when_the_exit_hooks_never_run(tmp_path: Path) -> None:
    # A Ctrl-C that cuts the library's exit hook short at its first instruction is the same, to
    # the files, as no hook at all: the writer writes once the program is done.
    proc = _run(
        """
        import atexit, sys
        from mstx_marks import mark, flush_at_exit
        from mstx_marks.export import out
        flush_at_exit(sys.argv[1])
        atexit.unregister(out._close_quietly)
        with mark("step"):
            pass
        """,
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert _db_names(tmp_path) == ["step"]


def test_asking_never_blocks_and_a_wait_has_its_deadline() -> None:
    gate = threading.Event()
    served: list[str] = []

    def serve(batch: list[Request], signalled: bool) -> None:
        if batch:
            gate.wait(10)  # a writer busy with a long export
            served.extend(r.kind for r in batch)

    writer = Writer(serve, None)
    try:
        began = time.monotonic()
        first = writer.ask("flush")
        second = writer.ask("close")  # queued behind the busy one: asking returned at once
        assert time.monotonic() - began < 0.5
        ok, result = writer.ask_and_wait("late", None, 0.2)
        assert (ok, result) == (False, None)  # the deadline, not the writer, ended the wait
        gate.set()
        assert first.wait(5) and second.wait(5)
        assert served[:2] == ["flush", "close"]
    finally:
        gate.set()
        writer.stop()
