from __future__ import annotations

import csv
import json
import re
import socket
import sqlite3
import subprocess
import time
import types
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from support.npu_stand_in import msprof_analyze as _msprof_analyze
from support.recorded import PID, T0, TID, recorded_rank, records, rng, synthetic_rank

from mstx_marks.base.records import RangeRecord, Record
from mstx_marks.export import (
    RankTrace,
    TraceFileError,
    ascend_db,
    ascend_db_path,
    export_rank,
    read_ascend_db,
    write_ascend_db,
)


def _rows(db: Path, query: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(query).fetchall()


def test_layout_and_schema_are_what_msprof_analyze_reads(tmp_path: Path) -> None:
    # 2023-11-14 22:13:20.009 UTC, named in local time as torch_npu names its folders.
    stamp = 1_700_000_000_009
    db = write_ascend_db(
        ascend_db_path(tmp_path, 3, worker="h_42", timestamp_ms=stamp), synthetic_rank(3)
    )
    local = time.strftime("%Y%m%d%H%M%S", time.localtime(stamp // 1000)) + "009"
    assert db.relative_to(tmp_path).as_posix() == (
        f"h_42_{local}_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_3.db"
    )
    info = json.loads((tmp_path / f"h_42_{local}_ascend_pt" / "profiler_info_3.json").read_text())
    assert info["rank_id"] == 3 and info["config"]["experimental_config"]["_export_type"] == ["db"]
    assert set(info) >= {"config", "start_info", "end_info", "rank_id"}
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


_DIST = {"world_size": 2, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 2}


def _two_ranks(run: Path) -> list[Path]:
    dbs = []
    for rank in range(2):
        trace = synthetic_rank(rank)
        trace.role = "actor"
        path = ascend_db_path(run, rank)
        dbs.append(write_ascend_db(path, trace, metadata={"distributed_args": _DIST}))
    return dbs


def test_metadata_tables_of_a_real_capture(tmp_path: Path) -> None:
    db = _two_ranks(tmp_path)[1]
    assert _rows(db, "SELECT id, name FROM ENUM_MSTX_EVENT_TYPE ORDER BY id") == [
        (0, "marker"), (1, "push/pop"), (2, "start/end"), (3, "marker_ex"),
    ]  # fmt: skip
    ((start, end),) = _rows(db, "SELECT startTimeNs, endTimeNs FROM SESSION_TIME_INFO")
    assert (start, end) == _rows(db, "SELECT MIN(startNs), MAX(endNs) FROM MSTX_EVENTS")[0]
    meta = dict(_rows(db, "SELECT name, value FROM META_DATA"))
    assert meta["SCHEMA_VERSION"] == "1.0.0" and meta["SCHEMA_VERSION_MAJOR"] == "1"
    assert json.loads(meta["distributed_args"]) == _DIST and json.loads(meta["role"]) == "actor"
    assert _rows(db, "SELECT rankId, deviceId FROM RANK_DEVICE_MAP") == [(1, -1)]
    ((uid, host),) = _rows(db, "SELECT hostUid, hostName FROM HOST_INFO")
    assert uid.isdigit() and host
    folder = db.parent.parent
    assert re.fullmatch(r".+_\d+_\d{17}_ascend_pt", folder.name)
    assert json.loads((folder / "profiler_metadata.json").read_text())["role"] == "actor"
    tables = {r[0] for r in _rows(db, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert not tables & {"TASK", "COMPUTE_TASK_INFO", "PYTORCH_API"}  # never empty device tables


def test_dp_analysis_marks_are_marker_events_and_read_back(tmp_path: Path) -> None:
    from mstx_marks.base.records import InstantRecord

    recs: list[Record] = [
        InstantRecord("{}", "step_process", T0, TID, PID),
        InstantRecord("x", "default", T0 + 1, TID, PID),
    ]
    db = write_ascend_db(tmp_path / "a.db", RankTrace(0, recs))
    assert _rows(db, "SELECT eventType FROM MSTX_EVENTS ORDER BY startNs") == [(0,), (3,)]
    assert [r.domain for r in read_ascend_db(db).instants] == ["step_process", "default"]


def test_real_cluster_all_lists_our_ranks(tmp_path: Path) -> None:
    exe = _msprof_analyze()
    _two_ranks(tmp_path / "run")
    out = tmp_path / "out"
    proc = subprocess.run(
        [exe, "cluster", "-m", "all", "-d", str(tmp_path / "run"), "-o", str(out), "--force"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    result = out / "cluster_analysis_output" / "cluster_analysis.db"
    assert result.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [json.loads(v) for k, v in _rows(result, "SELECT * FROM ClusterBaseInfo")] == [_DIST]
    ((uid, host),) = _rows(result, "SELECT hostUid, hostName FROM HostInfo")
    assert host == socket.gethostname()
    ranks = _rows(result, "SELECT rankId, deviceId, hostUid FROM RankDeviceMap ORDER BY rankId")
    assert ranks == [(0, -1, uid), (1, -1, uid)]


# MindStudio Insight's own queries, from its server source (gitcode.com/Ascend/msinsight, mirrored
# at https://github.com/xiaobingling93-pixel/Ascend-msinsight/blob/
# 91d1c4ec21625acb702dc65389b08780dfce0bf6/server/src/modules/timeline/core/database/
# DbTraceDataBase.cpp: UpdateStartTime, QueryRankId / QueryRankIdAndDeviceMap, QueryHostInfo;
# .../core/dataEngine/MstxRepo.cpp QuerySliceDetailInfo with EnumMstxEventTypeTable.h and
# TextTableColum.h for the column names). With no PYTORCH_API table Insight takes the time base
# from SESSION_TIME_INFO, and the rank from RANK_DEVICE_MAP.
_INSIGHT_TIME = "SELECT startTimeNs, endTimeNs FROM SESSION_TIME_INFO"
_INSIGHT_RANK = "SELECT DISTINCT rankId FROM RANK_DEVICE_MAP"
_INSIGHT_RANK_DEVICE = "SELECT DISTINCT deviceId, rankId FROM RANK_DEVICE_MAP"
_INSIGHT_HOST = "select hostName||hostUid||'' as host from HOST_INFO"
_INSIGHT_SLICE = "SELECT rowid, startNs, endNs, message, eventType FROM MSTX_EVENTS WHERE rowid = ?"
_INSIGHT_STRING = "SELECT id, value FROM STRING_IDS WHERE id IN (?)"
_INSIGHT_TYPE = "SELECT id, name FROM ENUM_MSTX_EVENT_TYPE WHERE id IN (?)"
_INSIGHT_DEPTH = "alter table MSTX_EVENTS add depth integer;"  # Insight writes into the file


def test_mindstudio_insight_queries_run_on_our_database(tmp_path: Path) -> None:
    db = _two_ranks(tmp_path)[1]
    trace = synthetic_rank(1)
    with sqlite3.connect(db) as conn:
        ((start, end),) = conn.execute(_INSIGHT_TIME).fetchall()
        assert start == min(r.start_ns for r in trace.records) and end > start
        assert conn.execute(_INSIGHT_RANK).fetchall() == [(1,)]
        assert conn.execute(_INSIGHT_RANK_DEVICE).fetchall() == [(-1, 1)]
        ((host,),) = conn.execute(_INSIGHT_HOST).fetchall()
        assert host.startswith(socket.gethostname())
        first = min(trace.ranges, key=lambda r: r.start_ns)
        rowid = conn.execute("SELECT rowid FROM MSTX_EVENTS ORDER BY startNs LIMIT 1").fetchone()
        ((_, s, e, message, kind),) = conn.execute(_INSIGHT_SLICE, rowid).fetchall()
        assert (s, e) == (first.start_ns, first.end_ns)
        assert conn.execute(_INSIGHT_STRING, (message,)).fetchall()[0][1] == first.name
        assert conn.execute(_INSIGHT_TYPE, (kind,)).fetchall() == [(2, "start/end")]
        conn.execute(_INSIGHT_DEPTH)
    assert read_ascend_db(db).records  # still ours to read after Insight altered it


# -- what the model steps carried (MSTX_ARGS), read by the summary's SQL as by the records ------


def _model_step_db(path: Path, marked: bool) -> Path:
    """Three decode steps carrying tokens and requests: ranges, or ``X_start``/``X_stop`` marks
    (mstx_sum pairs those into ranges, and so does the summary)."""
    from mstx_marks.base.records import InstantRecord

    recs: list[Record] = [RangeRecord("step", "default", T0, T0 + 9_000, TID, PID)]
    for i in range(3):
        start, end, args = (
            T0 + 1_000 * (i + 1),
            T0 + 1_000 * (i + 1) + 500,
            {"tokens": 8, "reqs": 2},
        )
        if marked:
            recs.append(InstantRecord("decode_batch_start", "vllm", start, TID, PID, args))
            recs.append(InstantRecord("decode_batch_stop", "vllm", end, TID, PID))
        else:
            recs.append(RangeRecord("decode_batch", "vllm", start, end, TID, PID, args=args))
    return write_ascend_db(path / "ascend_pytorch_profiler_0.db", RankTrace(0, recs))


def _runs(db: Path) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The model-step runs as the summary's SQL counts them, and as the records do."""
    from mstx_marks.analysis.model.aggregate import aggregate_trace
    from mstx_marks.analysis.readers.ascend_sql import aggregate_db

    sql, rec = aggregate_db(db).spans, aggregate_trace(read_ascend_db(db)).spans
    assert sql is not None and rec is not None
    return sql.batches.runs(), rec.batches.runs()


@pytest.mark.parametrize("marked", [False, True], ids=["ranges", "start/stop marks"])
def test_model_steps_keep_their_tokens_in_the_database(tmp_path: Path, marked: bool) -> None:
    sql, rec = _runs(_model_step_db(tmp_path, marked))
    assert sql == rec
    assert [(r[2], r[4], r[5], r[6]) for r in sql] == [(1, 8, 2, 1)] * 3  # steps, tokens, reqs


@pytest.mark.parametrize("bad", ["nested too deep", "another tool's table"])
def test_a_bad_args_table_costs_the_args_not_the_file(tmp_path: Path, bad: str) -> None:
    db = _model_step_db(tmp_path, marked=False)
    with sqlite3.connect(db) as conn:
        if bad == "nested too deep":  # (past the JSON parser's recursion limit)
            conn.execute("UPDATE MSTX_ARGS SET args = ?", ("[" * 200_000,))
        else:
            conn.execute("DROP TABLE MSTX_ARGS")
            conn.execute("CREATE TABLE MSTX_ARGS (id INTEGER, value TEXT)")
    sql, rec = _runs(db)
    assert sql == rec
    assert [(r[2], r[6]) for r in sql] == [(1, 0)] * 3  # counted; tokens not known
    assert all(r.args is None for r in read_ascend_db(db).ranges)
