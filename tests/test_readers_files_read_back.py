"""Files read back (issue 27, items 8 to 12): what ``summary`` must make of files it reads, at
their root: a database of any size we write, a database it must not trust (a recursive view), a
Chrome trace whose ranges never end, a capture it may not write beside, a spill whose header
holds a value it cannot use. Each reads the file where it can, and says what it could not use,
naming the file.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from support.recorded import PID, T0, TID

from mstx_marks.analysis.readers import chrome_json, part_of_file, stream
from mstx_marks.analysis.summary import Summary, load_traces, summarize, summarize_path
from mstx_marks.backends.record import Recorder
from mstx_marks.base.records import InstantRecord, Member, RangeRecord, Record, TraceFileError
from mstx_marks.cli.main import main as cli_main
from mstx_marks.export import RankTrace, db_open, read_ascend_db, write_ascend_db
from mstx_marks.export.spill import Spill

REALCAP = Path(__file__).resolve().parent.parent.parent / "shared" / "realcap"
MS = 1_000_000


def both(path: Path) -> list[Summary]:
    """The summary of ``path`` streamed (what the command runs) and read into memory (what the
    timelines read)."""
    streamed = summarize_path(path, jobs=1, progress=False)
    traces, errors, notes = load_traces(path)
    held = summarize(traces)
    held.errors, held.notes = errors, notes + held.notes
    return [streamed, held]


# 8. A database of any size we write is read: its queries hold no list of ids as variables.

#: SQLite's default bound on a statement's variables (since 3.32; Python's own builds allow
#: 250,000): the test's connections are held to it, so that a database past it stays small.
SQL_VARIABLES = 32_766
CAN_LIMIT = hasattr(sqlite3.Connection, "setlimit")  # (Python 3.11 and newer)
# More req<i>_start/req<i>_stop names (two a pair) and more ProfilerStep#N names than that. The
# issue's database, 125,010 pairs (250,020 names), was refused as "too many SQL variables"; where
# a connection's bound cannot be set, that one, past any build's.
PAIRS = 17_000 if CAN_LIMIT else 125_010
STEPS = 33_000


def _bounded(connect: Callable[..., sqlite3.Connection]) -> Callable[..., sqlite3.Connection]:
    def bounded(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        connection = connect(*args, **kwargs)
        connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQL_VARIABLES)
        return connection

    return bounded


def test_a_database_of_more_mark_pairs_and_numbered_steps_than_sql_variables_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if CAN_LIMIT:
        monkeypatch.setattr(sqlite3, "connect", _bounded(sqlite3.connect))
    recs: list[Record] = []
    for i in range(PAIRS):  # req<i>_start / req<i>_stop: one range req<i> each
        t = T0 + 10 * i
        recs.append(InstantRecord(f"req{i}_start", "default", t, TID, PID))
        recs.append(InstantRecord(f"req{i}_stop", "default", t + 4, TID, PID))
    recs += [
        RangeRecord(f"ProfilerStep#{n}", "default", T0 + 10 * n, T0 + 10 * n + 9, TID + 1, PID)
        for n in range(STEPS)
    ]
    db = write_ascend_db(tmp_path / "ascend_pytorch_profiler_0.db", RankTrace(0, recs))
    (part,) = part_of_file(db)  # in SQL, as summary reads it
    assert part.rank == 0 and part.n_records == PAIRS + STEPS
    assert part.step_count == STEPS and part.step_keys[:2] == ["0", "1"]  # ProfilerStep numbers
    assert len(part.phases) == PAIRS + 1  # each req<i> a phase, and the steps
    last = part.phases[f"req{PAIRS - 1}"]
    assert last.count == 1 and last.total_ns == 4
    assert sum(a.total_ns for n, a in part.phases.items() if n.startswith("req")) == 4 * PAIRS


# 9. A database that is not what it says: only tables are read, and in bounded time.


def _in_thread(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()``, failing the test (not hanging it) when it runs past ``seconds``."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s"
    return out[0]


VIEW_WHY = "(a query another program wrote, which may never end)"


def test_a_database_whose_events_are_a_recursive_view_is_named_not_read_for_ever(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ascend_pytorch_profiler_0.db"
    with closing(sqlite3.connect(db)) as c:
        c.executescript(
            "CREATE TABLE STRING_IDS(id INTEGER PRIMARY KEY, value TEXT);"
            "CREATE VIEW MSTX_EVENTS AS WITH RECURSIVE r(n) AS"
            " (SELECT 1 UNION ALL SELECT n + 1 FROM r)"
            " SELECT n AS startNs, n + 1 AS endNs, 2 AS eventType, 0 AS message,"
            " 0 AS domainId, 0 AS globalTid, 0 AS rangeId FROM r;"
        )
    for s in _in_thread(lambda: both(tmp_path), 60):
        (error,) = s.errors
        assert error == f"{db}: has MSTX_EVENTS as a view, not a table {VIEW_WHY}; not read"
    assert _in_thread(lambda: cli_main(["summary", str(tmp_path)]), 60) == 1
    assert f"error: {db}: has MSTX_EVENTS as a view" in capsys.readouterr().err


def test_a_query_past_its_time_is_stopped_with_the_file_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recs = [
        RangeRecord("gen", "default", T0 + 10 * i, T0 + 10 * i + 5, TID, PID) for i in range(5000)
    ]
    db = write_ascend_db(tmp_path / "ascend_pytorch_profiler_0.db", RankTrace(0, recs))
    (part,) = part_of_file(db)
    assert part.phases["generate_sequences"].count == 5000  # in time, read whole
    monkeypatch.setattr(db_open, "query_seconds", lambda size: 0.0)
    for s in both(tmp_path):
        (error,) = s.errors
        assert error.startswith(f"{db}: took more than 0 s in one query")
    # the public reader opens it the same way: one way to open a database, one bound
    with pytest.raises(TraceFileError, match="took more than 0 s in one query"):
        read_ascend_db(db)


def test_the_time_a_reader_spends_on_the_rows_is_not_the_querys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sink slower than the query's limit in all (a streaming summary on a loaded machine):
    every row read, nothing blamed on the file."""
    recs = [
        RangeRecord("gen", "default", T0 + 10 * i, T0 + 10 * i + 5, TID, PID) for i in range(5000)
    ]
    db = write_ascend_db(tmp_path / "ascend_pytorch_profiler_0.db", RankTrace(0, recs))
    monkeypatch.setattr(db_open, "query_seconds", lambda size: 0.3)
    seen: list[Record] = []

    def slow(rec: Record) -> None:
        seen.append(rec)
        if len(seen) % 250 == 0:
            time.sleep(0.05)  # (1 s in all, over 3 times the query's limit)

    read_ascend_db(db, sink=slow)
    assert len(seen) == 5000


# 10. A Chrome trace whose B events never get their E: counted and named in a note.

OPEN = 200_000


def _chrome_with_unended(path: Path, n: int) -> Path:
    events: list[dict[str, Any]] = [
        {"ph": "X", "name": "step", "pid": PID, "tid": TID, "ts": 0, "dur": 1000},
        {"ph": "B", "name": "gen", "pid": PID, "tid": TID, "ts": 1},
        {"ph": "E", "pid": PID, "tid": TID, "ts": 11},
        {"ph": "E", "pid": PID, "tid": TID + 1, "ts": 12},  # ends nothing on its thread
    ]
    events += [
        {"ph": "B", "name": "fwd" if i % 4 else "bwd", "pid": PID, "tid": TID + 2, "ts": 20 + i}
        for i in range(n)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _unended_note(s: Summary, path: Path) -> str:
    (note,) = [n for n in s.notes if "never ended" in n]
    assert note.startswith(f"{path}: ")
    return note


def test_200000_begin_events_never_ended_are_counted_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _chrome_with_unended(tmp_path / "trace.json", OPEN)
    for s in both(tmp_path):
        assert s.errors == []
        (gen,) = [p for p in s.phases if p.name == "generate_sequences"]
        assert gen.overall.count == 1 and gen.overall.total_ns == 10_000  # B/E paired
        note = _unended_note(s, path)
        assert f"{OPEN} ranges begun (B) never ended" in note
        assert f"fwd ({OPEN * 3 // 4}), bwd ({OPEN // 4})" in note
        assert "1 end (E) with no begin (B)" in note
    assert cli_main(["summary", str(tmp_path)]) == 0
    assert f"{OPEN} ranges begun (B) never ended" in capsys.readouterr().err


def test_begin_events_never_ended_in_a_trace_read_an_event_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _chrome_with_unended(tmp_path / "trace.json", 300)
    monkeypatch.setattr(chrome_json, "WHOLE_JSON_BYTES", 64)  # an event at a time
    monkeypatch.setattr(stream, "MAX_HELD_EVENTS", 1)  # and past it (two ranges): in one pass
    s = summarize_path(tmp_path, jobs=1)
    assert "300 ranges begun (B) never ended" in _unended_note(s, path)
    assert "summarised in one pass" in " ".join(s.notes)


def test_a_trace_of_begin_events_only_says_so(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([{"ph": "B", "name": "gen", "pid": 1, "tid": 1, "ts": 0}]))
    s = summarize_path(tmp_path, jobs=1)
    (note,) = [n for n in s.notes if str(path) in n]
    assert "1 range begun (B) never ended (no E)" in note and "gen (1)" in note


# 11. A capture is read where it lies, and nothing is written beside it.


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry of ``folder`` with its size and modification time."""
    return {e.name: (e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(folder)}


@pytest.fixture
def read_only_copy(tmp_path: Path) -> Iterator[Path]:
    """msprof_0.db (CANN's, in WAL mode) copied alone into a folder, both made read-only."""
    original = REALCAP / "msinsight_msprof_db" / "msprof_0.db"
    if not original.exists():
        pytest.skip(f"{original}: the shared real captures are not here (../shared/realcap)")
    folder = tmp_path / "share" / "PROF_1" / "mindstudio_profiler_output"
    folder.mkdir(parents=True)
    copy = folder / "msprof_0.db"
    shutil.copyfile(original, copy)
    copy.chmod(0o444)
    folder.chmod(0o555)
    yield copy
    folder.chmod(0o755)


def test_a_wal_capture_on_a_read_only_share_is_read_and_nothing_is_written_beside_it(
    read_only_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = read_only_copy
    assert db.read_bytes()[18:20] == b"\x02\x02"  # WAL mode, as CANN writes it
    original = REALCAP / "msinsight_msprof_db"
    before = _listing(original)
    for where in (db, db.parent.parent.parent, original):
        for s in both(where):
            assert s.errors == [] and sum(p.overall.count for p in s.phases) == 13
        assert cli_main(["summary", str(where), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["phases"]
        assert sorted(os.listdir(db.parent)) == ["msprof_0.db"]  # no -shm, no -wal
    assert _listing(original) == before  # nothing made, and its old -shm not written to


def test_a_wal_file_beside_a_database_is_left_unread_with_a_note(tmp_path: Path) -> None:
    recs = [RangeRecord("gen", "default", T0, T0 + 5, TID, PID)]
    db = write_ascend_db(tmp_path / "ascend_pytorch_profiler_0.db", RankTrace(0, recs))
    with closing(sqlite3.connect(db)) as writer:  # a writer still running: its pages in -wal
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("INSERT INTO MSTX_EVENTS SELECT * FROM MSTX_EVENTS")
        writer.commit()
        wal = Path(f"{db}-wal")
        assert wal.stat().st_size > 0
        listed = _listing(tmp_path)
        for s in both(tmp_path):
            (gen,) = [p for p in s.phases if p.name == "generate_sequences"]
            assert s.errors == [] and gen.overall.count == 1  # as the database holds it
            (note,) = [n for n in s.notes if "-wal" in n]
            assert note.startswith(f"{db}: its write-ahead log {wal.name} holds")
        assert _listing(tmp_path) == listed


# 12. A spill header value that cannot be used names the file and the field.


def _spill(out: Path) -> Path:
    rec = Recorder()
    spill = Spill(out, rec, rank=3, role="trainer")
    for _ in range(2):
        step = rec.range_start("step", "default")
        rec.range_end(rec.range_start("update_actor", "default"), "default")
        rec.range_end(step, "default")
    return spill.write_now(final=True)


def _set_header(path: Path, **fields: Any) -> None:
    head, _, rest = path.read_bytes().partition(b"\n")
    header = json.loads(head)
    header.update(fields)
    path.write_bytes(json.dumps(header).encode() + b"\n" + rest)


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("rank", float("inf"), "Infinity"),
        ("rank", "3", '"3"'),
        ("rank", 2.5, "2.5"),
        ("rank", -1, "-1"),
        ("pid", -7, "-7"),
        ("pid", [1], "[1]"),
    ],
)
def test_a_spill_header_value_that_cannot_be_used_names_the_file_and_the_field(
    tmp_path: Path, field: str, value: Any, shown: str
) -> None:
    path = _spill(tmp_path / "out")
    _set_header(path, **{field: value})
    for s in both(tmp_path / "out"):
        assert s.errors == []
        (note,) = [n for n in s.notes if "header" in n]
        assert note == f"{path}: its header's {field} is {shown}, not an int >= 0: read as 0"
        (upd,) = [p for p in s.phases if p.name == "update_actor"]  # the file is still read
        assert upd.overall.count == 2
        rank = 0 if field == "rank" else 3
        assert s.members() == [Member("trainer", rank)]


def test_a_spill_too_large_to_hold_names_its_header_value_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _spill(tmp_path / "out")
    _set_header(path, rank=float("nan"))
    monkeypatch.setattr(stream, "MAX_HELD_EVENTS", 2)  # read in one pass
    s = summarize_path(tmp_path / "out", jobs=1)
    assert [n for n in s.notes if n.startswith(f"{path}: its header's rank is NaN")]
    assert [n for n in s.notes if "summarised in one pass" in n]


def test_a_sound_spill_header_says_nothing(tmp_path: Path) -> None:
    _spill(tmp_path / "out")
    for s in both(tmp_path / "out"):
        assert s.errors == [] and not [n for n in s.notes if "header" in n]
        assert s.members() == [Member("trainer", 3)]
