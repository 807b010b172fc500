"""The streaming exporter: a spill's Chrome trace and database, written in bounded memory, are
the documents the in-memory writers make of the spill read whole (same events, same tracks,
same ``otherData``, same rows), however the spill's events are ordered; a deadline leaves the
previous files and nothing else; an empty spill writes nothing."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.recorded import T0

from mstx_marks.backends.record import Recorder
from mstx_marks.base.records import InstantRecord, RangeRecord, RankTrace, Record, step_spans
from mstx_marks.export import chrome, start_order, stream
from mstx_marks.export.ascend_db import read_ascend_db, write_ascend_db
from mstx_marks.export.chrome import chrome_trace, dumps, write_chrome_trace
from mstx_marks.export.files import UnsafeOutput
from mstx_marks.export.spill import Spill, read_spill
from mstx_marks.export.start_order import START, StartOrder, events
from mstx_marks.export.stream import ExportTimedOut, export_spill

PROCESS = "host-7"


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows, chunks, runs and spools of a few events: every path of the streaming exporter
    (late events, runs merged in stages, tracks spooled to scratch files) on small spills."""
    monkeypatch.setattr(start_order, "CHUNK", 8)
    monkeypatch.setattr(start_order, "WINDOW", 8)
    monkeypatch.setattr(start_order, "_RUN_PIECE", 3)
    monkeypatch.setattr(start_order, "_FAN_IN", 2)
    monkeypatch.setattr(chrome, "_SPOOL_EVENTS", 5)


# --- the order -------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    starts=st.lists(st.integers(0, 40), max_size=120),
    chunk=st.integers(1, 9),
    window=st.integers(1, 9),
)
def test_any_order_comes_back_by_start_then_arrival(
    tmp_path_factory: pytest.TempPathFactory, starts: list[int], chunk: int, window: int
) -> None:
    folder = tmp_path_factory.mktemp("order")
    recs = [InstantRecord(f"e{i}", "d", s, 1, 1) for i, s in enumerate(starts)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(start_order, "_RUN_PIECE", 2)
        mp.setattr(start_order, "_FAN_IN", 2)
        with StartOrder(lambda: start_order_scratch(folder), chunk=chunk, window=window) as order:
            for rec in recs:
                order.add(rec)
            batches = list(order.batches())
    got = [e for b in batches for e in b]
    assert got == events(sorted(recs, key=lambda r: r.start_ns))  # (a stable sort)
    for before, after in zip(batches, batches[1:]):  # one start never spans two batches...
        many = len(before) >= 4 * chunk and len({e[START] for e in before}) == 1
        assert before[-1][START] < after[0][START] or many  # ...but past 4 chunks of one start
    assert list(folder.iterdir()) == []  # scratch files have no name


def start_order_scratch(folder: Path) -> Any:
    from mstx_marks.export.files import scratch_file

    return scratch_file(folder)


# --- the same documents as the in-memory writers ------------------------------------------------


def _spill_with_lines(out: Path, lines: list[list[Any]]) -> Path:
    """A spill of this format (its header written by the real writer, with one event) and then
    ``lines``, each an event line of its own (``r``, ``o``, ``i``: see spill.py)."""
    rec = Recorder()
    rec.range_end(rec.range_start("first", "default"), "default")
    spill = Spill(out, rec, rank=3, role="trainer")
    path = spill.write_now()
    with open(path, "a") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    return path


def _line(rec: Record, tid: int) -> list[Any]:
    if isinstance(rec, InstantRecord):
        line: list[Any] = ["i", rec.name, rec.domain, rec.start_ns, None, tid]
    else:
        line = ["o" if rec.open else "r", rec.name, rec.domain, rec.start_ns, rec.end_ns, tid]
    if rec.args:
        line.append(dict(rec.args))
    return line


def _chrome_doc(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    doc["otherData"].pop("clock")
    return dict(doc)


def _reference_doc(trace: RankTrace) -> dict[str, Any]:
    """The in-memory builder's document (thread_tracks over the records held whole)."""
    doc = json.loads(dumps(chrome_trace([trace])))
    doc["otherData"].pop("clock")
    return dict(doc)


_TABLES = ("MSTX_EVENTS", "STRING_IDS", "STEP_TIME", "MSTX_ARGS", "SESSION_TIME_INFO",
           "META_DATA", "RANK_DEVICE_MAP", "ENUM_MSTX_EVENT_TYPE")  # fmt: skip


def _db_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(path) as db:
        return {t: db.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in _TABLES}


def _expected_events(trace: RankTrace) -> list[tuple[Any, ...]]:
    """MSTX_EVENTS as the exporter always wrote it (the oracle: the rule, row by row)."""
    ids: dict[str, int] = {}
    rows = []
    for n, r in enumerate(trace.records, start=1):
        msg = ids.setdefault(r.name, len(ids) + 1)
        dom = ids.setdefault(r.domain, len(ids) + 1)
        gtid = (r.pid << 32) | (r.thread & 0xFFFFFFFF)
        if isinstance(r, InstantRecord):
            kind, end = (0 if r.domain == "step_process" else 3), r.start_ns
        else:
            kind, end = 2, r.end_ns
        rows.append((r.start_ns, end, kind, n, None, msg, gtid, gtid, dom, n))
    return rows


def _assert_same_exports(tmp: Path, spill: Path) -> stream.Exported:
    trace = read_spill(spill)
    done = export_spill(tmp / "out", spill, process=PROCESS)
    chrome_path, db = done.paths
    assert done.events == len(trace.records) and (done.rank, done.role) == (3, "trainer")
    assert _chrome_doc(chrome_path) == _reference_doc(trace)
    old_db = write_ascend_db(tmp / "ref" / "ascend_pytorch_profiler_3.db", trace)
    rows = _db_rows(db)
    assert rows == _db_rows(old_db)
    assert rows["MSTX_EVENTS"] == _expected_events(trace)
    assert rows["STEP_TIME"] == [(i, s, e) for i, (s, e) in enumerate(step_spans(trace.records), 1)]
    back = read_ascend_db(db)
    key = lambda r: (r.start_ns, r.kind, r.name, r.thread)  # noqa: E731
    want = sorted((r._replace(open=False) if isinstance(r, RangeRecord) else r
                   for r in trace.records), key=key)  # fmt: skip
    assert sorted(back.records, key=key) == want
    assert not [p for p in (tmp / "out").rglob("*") if ".tmp" in p.name]
    return done


names = st.sampled_from(["step", "gen", "update_actor", "é_x", 'q"%s', "step_process"])


@st.composite
def spill_events(draw: st.DrawFn) -> list[tuple[Record, int]]:
    """Records on a few threads, many sharing starts, some zero-length, some open, some with
    arguments, in any order: (record, thread)."""
    out: list[tuple[Record, int]] = []
    for _ in range(draw(st.integers(0, 60))):
        start = T0 + draw(st.integers(0, 40))
        tid = draw(st.sampled_from([11, 12, 13]))
        name, domain = draw(names), draw(st.sampled_from(["default", "verl", "step_process"]))
        args = draw(st.none() | st.fixed_dictionaries({"n": st.integers(0, 9)}))
        if draw(st.integers(0, 3)) == 0:
            out.append((InstantRecord(name, domain, start, tid, 0, args), tid))
        else:
            end = start + draw(st.sampled_from([0, 1, 5, 20, 60]))
            is_open = draw(st.integers(0, 9)) == 0
            out.append((RangeRecord(name, domain, start, end, tid, 0, is_open, args), tid))
    return out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(recs=spill_events(), seed=st.integers(0, 2**16))
def test_any_spill_streams_to_the_documents_the_in_memory_writers_make(
    tmp_path_factory: pytest.TempPathFactory,
    small: None,  # (the same small sizes for every example)
    recs: list[tuple[Record, int]],
    seed: int,
) -> None:
    tmp = tmp_path_factory.mktemp("s")
    random.Random(seed).shuffle(recs)
    spill = _spill_with_lines(tmp, [_line(r, tid) for r, tid in recs])
    _assert_same_exports(tmp, spill)


def _recorded_spill(out: Path, n: int = 3000) -> Path:
    """A real recording, spilled by the real writer in several writes: nested ranges, many
    names, instants, user arguments, a range on two overlapping asyncio-like tasks of one
    thread, other threads, a ``step`` that outlives every write (an ``r`` line) and a range
    still open at the final write (an ``o`` line)."""
    rec = Recorder()
    spill = Spill(out, rec, rank=3, role="trainer")
    step = rec.range_start("step", "default")
    for i in range(n):
        h = rec.range_start(f"micro_batch_{i}", "verl")
        inner = rec.range_start("forward", "verl")
        rec.range_end(inner, "verl")
        if i % 7 == 0:
            rec.instant("tick", "default")
        if i % 11 == 0:
            rec.instant_with_args("sync", "default", {"i": i})
        if i % 13 == 0:
            rec.set_args(h, {"n": i, "tag": "x"})
        rec.range_end(h, "verl")
        if i % 500 == 0:
            spill.write_now()
    a = rec.range_start("update_actor", "default")
    b = rec.range_start("compute_score", "default")
    rec.range_end(a, "default")
    rec.range_end(b, "default")

    def worker() -> None:
        for _ in range(300):
            rec.range_end(rec.range_start("rollout", "vllm"), "vllm")

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec.range_end(step, "default")
    rec.range_start("left_open", "default")
    return spill.write_now(final=True)


def test_a_real_spill_streams_to_the_documents_the_in_memory_writers_make(
    tmp_path: Path, small: None
) -> None:
    spill = _recorded_spill(tmp_path)
    lines = [x[:2] for x in map(json.loads, spill.read_text().splitlines()) if type(x) is list]
    assert ["r", "step"] in lines and ["o", "left_open"] in lines  # outlived writes, left open
    done = _assert_same_exports(tmp_path, spill)
    (back,) = chrome.read_chrome_trace(done.paths[0])
    assert {r.name for r in back.records} >= {"micro_batch_2999", "rollout", "left_open"}
    tracks = [e for e in json.loads(done.paths[0].read_text())["traceEvents"]
              if e["name"] == "thread_name"]  # fmt: skip
    assert any("(overlap 1)" in e["args"]["name"] for e in tracks)


def test_the_writers_in_memory_are_the_streaming_ones(tmp_path: Path, small: None) -> None:
    """write_chrome_trace and write_ascend_db stream too: the same documents whatever the
    size of their windows (the equivalence above, for traces held in memory)."""
    spill = _recorded_spill(tmp_path, n=300)
    trace = read_spill(spill)
    path = write_chrome_trace(tmp_path / "t.trace.json", [trace, RankTrace(5, trace.records[:9])])
    both = json.loads(dumps(chrome_trace([trace, RankTrace(5, trace.records[:9])])))
    doc = json.loads(path.read_text())
    for d in (doc, both):
        d["otherData"].pop("clock")
    assert doc == both
    db = write_ascend_db(tmp_path / "x.db", trace)
    assert _db_rows(db)["MSTX_EVENTS"] == _expected_events(trace)


def test_an_empty_spill_writes_nothing(tmp_path: Path) -> None:
    spill = _spill_with_lines(tmp_path / "s", [])
    lines = spill.read_text().splitlines()
    spill.write_text(lines[0] + "\n")  # its header only
    done = export_spill(tmp_path / "out", spill, process=PROCESS)
    assert done.paths == [] and done.events == 0 and not (tmp_path / "out").exists()


def test_pending_lines_are_read_after_the_file(tmp_path: Path) -> None:
    spill = _spill_with_lines(tmp_path, [])
    extra = json.dumps(["r", "late", "default", T0, T0 + 5, 1]).encode() + b"\n"
    done = export_spill(tmp_path, spill, extra=extra, rank=9, role="critic", process=PROCESS)
    assert done.paths[0].name == f"critic-rank9-{PROCESS}.trace.json"
    (t,) = chrome.read_chrome_trace(done.paths[0])
    assert sorted(r.name for r in t.records) == ["first", "late"] and t.role == "critic"
    assert read_ascend_db(done.paths[1]).rank == 9


def test_a_link_in_the_way_is_said_as_such_while_the_spill_is_read(
    tmp_path: Path, small: None
) -> None:
    """The scratch files go beside the Chrome trace, made while the spill is read: a link
    there is refused as a link, not taken for a spill that cannot be read."""
    spill = _recorded_spill(tmp_path, n=50)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "chrome").symlink_to(elsewhere)
    with pytest.raises(UnsafeOutput, match="chrome: it is a link"):
        export_spill(out, spill, process=PROCESS)
    assert list(elsewhere.iterdir()) == []


# --- the deadline ------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["reading the spill", "writing the Chrome trace and database"])
def test_past_its_deadline_the_previous_files_stand_and_nothing_is_left(
    tmp_path: Path, small: None, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    spill = _recorded_spill(tmp_path, n=200)
    out = tmp_path / "out"
    before = export_spill(out, spill, process=PROCESS)
    kept = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    late = [stage == "reading the spill"]  # else: once the spill is read

    def read_then_late(*args: Any, **kwargs: Any) -> RankTrace:
        trace = read_spill(*args, **kwargs)
        late[0] = True
        return trace

    monkeypatch.setattr(stream, "read_spill", read_then_late)
    monkeypatch.setattr(stream.time, "monotonic", lambda: 10.0 if late[0] else 0.0)
    with pytest.raises(ExportTimedOut, match=stage) as info:
        export_spill(out, spill, process=PROCESS, deadline=5.0)
    assert isinstance(info.value, TimeoutError) and "events done" in str(info.value)
    assert info.value.total in (None, before.events)  # (unknown while the spill is read)
    assert str(spill) in str(info.value) and "kept" in str(info.value)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == kept
    assert before.paths[0].exists()


# --- memory ------------------------------------------------------------------------------------


def test_memory_stays_bounded_whatever_the_spill_holds(tmp_path: Path) -> None:
    """Eight times the events, the same peak beyond what reading the spill takes (its batch
    of lines): the exporter holds a window, a chunk and a batch (the old one held every event,
    about 240 bytes each)."""
    extra = []
    for n in (8_000, 64_000):
        rec = Recorder(capacity=n + 10)
        for i in range(n // 2):
            rec.range_end(rec.range_start(f"phase_{i % 50}", "verl"), "verl")
            rec.instant("tick", "verl")
        spill = Spill(tmp_path / str(n), rec, rank=0).write_now(final=True)
        del rec
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(start_order, "CHUNK", 1024)
            mp.setattr(start_order, "WINDOW", 1024)
            mp.setattr(chrome, "_SPOOL_EVENTS", 1024)
            peaks = []
            for export in (False, True):
                tracemalloc.start()
                try:
                    if export:
                        export_spill(tmp_path / str(n), spill, process=PROCESS)
                    else:
                        read_spill(spill, sink=lambda r: None)
                    peaks.append(tracemalloc.get_traced_memory()[1])
                finally:
                    tracemalloc.stop()
        extra.append(peaks[1] - peaks[0])
    assert extra[1] < 1.3 * extra[0] + 100_000, extra  # not 8x
    assert extra[1] < 64_000 * 20, extra  # under 20 bytes an event at 64,000


def test_a_late_event_far_from_its_place_is_merged_in(tmp_path: Path, small: None) -> None:
    """A range written long after its start (a step that outlived many writes) among many
    events in order: it goes where it starts, and ties keep the order they came in."""
    lines = [["r", f"e{i}", "d", T0 + i, T0 + i + 1, 1] for i in range(100)]
    lines += [["r", "step", "d", T0 + 3, T0 + 200, 1], ["i", "mark", "d", T0 + 50, None, 1]]
    spill = _spill_with_lines(tmp_path, lines)
    done = _assert_same_exports(tmp_path, spill)
    with sqlite3.connect(done.paths[1]) as db:  # numbered by start, then as they came
        query = "SELECT s.value FROM MSTX_EVENTS e JOIN STRING_IDS s ON s.id = e.message"
        names = [n for (n,) in db.execute(query + " ORDER BY e.rangeId")]
    assert names[names.index("e3") + 1] == "step" and names.index("mark") == names.index("e50") + 1
    (t,) = chrome.read_chrome_trace(done.paths[0])  # on its thread's track: the longest first
    names = [r.name for r in sorted(t.records, key=lambda r: r.start_ns)]
    assert names[names.index("step") + 1] == "e3"


def test_a_trace_of_records_in_any_order_is_written_in_start_order(tmp_path: Path) -> None:
    recs = [RangeRecord("a", "d", T0 + s, T0 + s + 2, 1, 1) for s in (5, 1, 3)]
    path = write_chrome_trace(tmp_path / "x.trace.json", [RankTrace(0, recs)])
    starts = [e["ts"] for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert starts == sorted(starts)


def test_export_times_are_what_was_recorded(tmp_path: Path) -> None:
    """``ts`` and ``dur`` are written with three decimals (microseconds): every nanosecond."""
    spill = _spill_with_lines(tmp_path, [["r", "x", "d", T0 + 1_234_567, T0 + 1_234_999, 1]])
    done = export_spill(tmp_path, spill, process=PROCESS)
    (t,) = chrome.read_chrome_trace(done.paths[0])
    (x,) = [r for r in t.records if r.name == "x"]
    assert (x.start_ns, x.end_ns) == (T0 + 1_234_567, T0 + 1_234_999)
