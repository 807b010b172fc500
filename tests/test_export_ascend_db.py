from __future__ import annotations

import csv
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import types
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from support.recorded import PID, T0, TID, recorded_rank, records, rng, synthetic_rank

from mstx_marks.export import (
    RankTrace,
    TraceFileError,
    ascend_db,
    ascend_db_path,
    export_rank,
    read_ascend_db,
    write_ascend_db,
)
from mstx_marks.records import RangeRecord, Record


def _rows(db: Path, query: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(query).fetchall()


def test_layout_and_schema_are_what_msprof_analyze_reads(tmp_path: Path) -> None:
    db = write_ascend_db(ascend_db_path(tmp_path, 3, worker="w", timestamp_ms=9), synthetic_rank(3))
    assert db.relative_to(tmp_path).as_posix() == (
        "w_9_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_3.db"
    )
    assert (tmp_path / "w_9_ascend_pt" / "profiler_info_3.json").is_file()
    cols = [r[1] for r in _rows(db, "PRAGMA table_info(MSTX_EVENTS)")]
    assert cols == [
        "startNs", "endNs", "eventType", "rangeId", "category", "message", "globalTid",
        "endGlobalTid", "domainId", "connectionId",
    ]  # fmt: skip
    events = _rows(db, "SELECT eventType, globalTid, connectionId, startNs, endNs FROM MSTX_EVENTS")
    assert {e[0] for e in events} == {2, 3}
    assert {e[1] for e in events} == {PID << 32 | TID}
    conns = [e[2] for e in events]
    assert None not in conns and 4294967295 not in conns and len(set(conns)) == len(conns)
    assert all(s == e for kind, _, _, s, e in events if kind == 3)
    assert _rows(db, "SELECT id, startNs - ?, endNs - ? FROM STEP_TIME".replace("?", str(T0))) == [
        (1, 0, 1000), (2, 1005, 2005), (3, 2010, 3010),
    ]  # fmt: skip


def test_explicit_steps_win_over_step_ranges(tmp_path: Path) -> None:
    trace = RankTrace(0, [rng("step", 0, 10)], steps=[(T0 + 1, T0 + 2)])
    db = write_ascend_db(tmp_path / "a.db", trace)
    assert _rows(db, f"SELECT startNs - {T0} FROM STEP_TIME") == [(1,)]


@settings(max_examples=40, deadline=None)
@given(recs=records())
def test_round_trip(tmp_path_factory: pytest.TempPathFactory, recs: list[Record]) -> None:
    path = tmp_path_factory.mktemp("db") / "ascend_pytorch_profiler_2.db"
    back = read_ascend_db(write_ascend_db(path, RankTrace(2, recs)))
    assert back.rank == 2 and back.source == path
    # The database has no column for "still open": such a range reads back as ended at its end.
    closed = [r._replace(open=False) if isinstance(r, RangeRecord) else r for r in recs]
    key = lambda r: (r.start_ns, r.kind, r.name, r.domain, r.thread, r.pid)  # noqa: E731
    assert sorted(back.records, key=key) == sorted(closed, key=key)


def test_reads_torch_npu_rows_that_mstx_sum_drops(tmp_path: Path) -> None:
    # A real torch_npu database: host-only ranges (connectionId 4294967295), push/pop ranges,
    # a NULL domain, and no rank in the file name but a profiler_info file beside the output.
    out = tmp_path / "host_1_5_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out.parent / "profiler_info_6.json").write_text("{}")
    db = out / "ascend_pytorch_profiler.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(
            "CREATE TABLE STRING_IDS (id INTEGER PRIMARY KEY, value TEXT);"
            "CREATE TABLE MSTX_EVENTS (startNs INTEGER, endNs INTEGER, eventType INTEGER,"
            " rangeId INTEGER, category INTEGER, message INTEGER, globalTid INTEGER,"
            " endGlobalTid INTEGER, domainId INTEGER, connectionId INTEGER);"
            "INSERT INTO STRING_IDS VALUES (1, 'update_actor'), (2, 'dataloader');"
            "INSERT INTO MSTX_EVENTS VALUES"
            " (10, 30, 2, 1, NULL, 1, 4294967396, 0, NULL, 4294967295),"
            " (40, 45, 1, 2, NULL, 2, 4294967396, 0, NULL, NULL);"
        )
    trace = read_ascend_db(db)
    assert trace.rank == 6 and trace.steps == []
    assert [(r.name, r.domain, r.end_ns, r.pid, r.thread) for r in trace.ranges] == [
        ("update_actor", "default", 30, 1, 100),
        ("dataloader", "default", 45, 1, 100),
    ]


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"not a database at all" * 100, "not a readable profiler database"), (b"", "no MSTX_EVENTS")],
)
def test_bad_databases_are_errors_naming_the_file(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "ascend_pytorch_profiler_0.db"
    path.write_bytes(content)
    with pytest.raises(TraceFileError, match=problem) as info:
        read_ascend_db(path)
    assert str(info.value).startswith(str(path))


def _msprof_analyze() -> str:
    # pip puts its script beside this interpreter, which need not be on PATH.
    beside = Path(sys.executable).with_name("msprof-analyze")
    exe = (
        os.environ.get("MSPROF_ANALYZE")
        or shutil.which("msprof-analyze")
        or (str(beside) if beside.exists() else None)
    )
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("msprof-analyze is not installed (pip install msprof-analyze==26.2.0)")
        pytest.skip("msprof-analyze is not installed; set MSPROF_ANALYZE or install it")
    return exe


def _base_name(name: str) -> str:
    # mstx_sum names a nested range "parent::child" and numbers repeats within a step "x_0".
    return re.sub(r"_\d+\Z", "", name.rsplit("::", 1)[-1])


def test_real_msprof_analyze_agrees_with_the_recorder(tmp_path: Path) -> None:
    exe = _msprof_analyze()
    traces = [recorded_rank(rank, steps=3, tokens=3) for rank in range(3)]
    for trace in traces:
        export_rank(tmp_path / "run", trace)
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            exe,
            "cluster",
            "-m",
            "mstx_sum",
            "-d",
            str(tmp_path / "run"),
            "-o",
            str(out),
            "--export_type",
            "text",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    stats = out / "cluster_analysis_output" / "MstxSum" / "mark_stats.csv"
    # msprof-analyze exits 0 even when it fails: its output file is the only evidence.
    assert stats.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]

    theirs: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    with stats.open(newline="") as f:
        for row in csv.DictReader(f):
            key = (_base_name(row["Name"]), int(row["Rank"]), int(row["StepId"]))
            theirs[key].append(round(float(row["CannDuration(Ms)"]) * 1e6))
    ours: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for trace in traces:
        steps = trace.with_steps().steps
        for r in trace.ranges:
            assert r.end_ns is not None
            step = next(i for i, (s, e) in enumerate(steps, 1) if s <= r.start_ns <= e)
            ours[(r.name, trace.rank, step)].append(r.end_ns - r.start_ns)
    assert {k: sorted(v) for k, v in theirs.items()} == {k: sorted(v) for k, v in ours.items()}
    assert len(ours) == 4 * 3 * 3  # four phases, three ranks, three steps
    with (stats.parent / "all_cann_stats.csv").open(newline="") as f:
        counts = defaultdict(int)
        for row in csv.DictReader(f):
            counts[_base_name(row["Name"])] += int(float(row["Count"]))
    assert counts == {"step": 9, "gen": 9, "vllm_one_step": 27, "update_actor": 9}


def test_ranks_exported_in_the_same_millisecond_get_their_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # msprof-analyze maps one *_ascend_pt folder to one rank (its first profiler_info_N.json):
    # two ranks in one folder would silently lose one of them.
    monkeypatch.setattr(ascend_db, "time", types.SimpleNamespace(time=lambda: 1_700_000_000.0))
    for rank in range(3):
        export_rank(tmp_path, synthetic_rank(rank))
    folders = sorted((tmp_path / "ascend").iterdir())
    assert len(folders) == 3
    for rank, folder in enumerate(folders):
        assert [p.name for p in folder.glob("profiler_info_*.json")] == [
            f"profiler_info_{rank}.json"
        ]
        assert read_ascend_db(
            folder / "ASCEND_PROFILER_OUTPUT" / f"ascend_pytorch_profiler_{rank}.db"
        ).ranges


def test_malformed_rows_are_errors_naming_the_file(tmp_path: Path) -> None:
    # A bad value must be a TraceFileError, so `summary` reports the file and reads the rest.
    path = tmp_path / "ascend_pytorch_profiler_0.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE STRING_IDS (id INTEGER PRIMARY KEY, value TEXT);"
            "CREATE TABLE MSTX_EVENTS (startNs INTEGER, endNs INTEGER, eventType INTEGER,"
            " rangeId INTEGER, category INTEGER, message INTEGER, globalTid INTEGER,"
            " endGlobalTid INTEGER, domainId INTEGER, connectionId INTEGER);"
            "INSERT INTO MSTX_EVENTS VALUES ('soon', 30, 2, 1, NULL, 1, 1, 1, NULL, 1);"
        )
    with pytest.raises(TraceFileError, match="malformed") as info:
        read_ascend_db(path)
    assert info.value.path == path


def test_names_sqlite_cannot_encode_are_replaced_not_fatal(tmp_path: Path) -> None:
    # A lone surrogate is a valid Python str (names.py allows it) but not UTF-8: the database,
    # and with it the whole flush, used to fail with UnicodeEncodeError.
    rec = RangeRecord("bad\ud800name", "default", T0, T0 + 5, TID, PID)
    back = read_ascend_db(write_ascend_db(tmp_path / "a.db", RankTrace(0, [rec])))
    assert [(r.name, r.end_ns) for r in back.records] == [("bad\ufffdname", T0 + 5)]
