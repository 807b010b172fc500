from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.recorded import T0, records, rng, synthetic_rank

from mstx_marks.base.records import InstantRecord, RangeRecord, Record
from mstx_marks.export import RankTrace, TraceFileError, read_chrome_trace, write_chrome_trace
from mstx_marks.export.chrome import chrome_trace


def test_events_follow_the_trace_event_format() -> None:
    doc = chrome_trace([synthetic_rank(0, steps=1, tokens=2), synthetic_rank(1, steps=1)])
    events = doc["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    complete = [e for e in events if e["ph"] == "X"]
    instants = [e for e in events if e["ph"] == "i"]
    assert len(complete) == 2 * 3 + 2 + 4 and len(instants) == 2
    token = next(e for e in complete if e["name"] == "vllm_one_step")
    assert token["cat"] == token["args"]["domain"] == "vllm_one_step"
    assert token["tid"] == 777 and token["dur"] == 0.04  # 40 ns in microseconds
    assert instants[0]["s"] == "t"
    assert doc["otherData"]["origin_ns"] == T0 // 10**15 * 10**15  # (one grid: every file of a job)


def test_open_ranges_are_kept_and_flagged() -> None:
    doc = chrome_trace([RankTrace(0, [rng("step", 0, 9, open=True), rng("gen", 0, 5)])])
    ranges = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    assert ranges["step"]["args"]["open"] is True and "open" not in ranges["gen"]["args"]


@settings(max_examples=60, deadline=None)
@given(recs=records())
def test_round_trip_keeps_every_nanosecond(
    tmp_path_factory: pytest.TempPathFactory, recs: list[Record]
) -> None:
    path = tmp_path_factory.mktemp("c") / "r.trace.json"
    trace = RankTrace(5, recs, steps=[(T0, T0 + 10)])
    write_chrome_trace(path, [trace])
    back = read_chrome_trace(path)
    if not recs:
        assert back == []
        return
    (got,) = back
    assert got.rank == 5 and got.steps == [(T0, T0 + 10)] and got.source == path
    key = lambda r: (r.start_ns, r.kind, r.name, r.domain, r.thread)  # noqa: E731
    want = [r._replace(pid=0) for r in sorted(recs, key=key)]
    assert [r._replace(pid=0) for r in sorted(got.records, key=key)] == want


def test_written_file_is_plain_json_with_no_temporary_left(tmp_path: Path) -> None:
    path = write_chrome_trace(tmp_path / "x.trace.json", [synthetic_rank(0)])
    assert json.loads(path.read_text())["displayTimeUnit"] == "ms"
    assert [p.name for p in tmp_path.iterdir()] == ["x.trace.json"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"traceEvents": [', "not valid JSON"),
        ('{"traceEvents": []}', "not a Chrome trace written by mstx_marks"),
        ('{"otherData": {"generator": "mstx_marks"}}', "no traceEvents"),
        (
            '{"otherData": {"generator": "mstx_marks"}, "traceEvents": [{"ph": "X"}]}',
            "malformed event",
        ),
        (  # used to escape as a bare ValueError and abort `summary` over a whole tree
            '{"otherData": {"generator": "mstx_marks", "origin_ns": "soon"}, "traceEvents": []}',
            "malformed",
        ),
        (  # json reads Infinity; round() of it is an OverflowError, not a ValueError
            '{"otherData": {"generator": "mstx_marks"}, "traceEvents": [{"ph": "X", "pid": 0,'
            ' "tid": 1, "name": "a", "ts": Infinity, "dur": 1}]}',
            "malformed event",
        ),
    ],
)
def test_bad_files_are_errors_naming_the_file(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "bad.trace.json"
    path.write_text(content)
    with pytest.raises(TraceFileError, match=problem) as info:
        read_chrome_trace(path)
    assert str(info.value).startswith(str(path)) and info.value.path == path


def test_truncated_real_trace_is_an_error(tmp_path: Path) -> None:
    path = write_chrome_trace(tmp_path / "t.trace.json", [synthetic_rank(0)])
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(TraceFileError, match="truncated"):
        read_chrome_trace(path)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None)
@given(args=st.dictionaries(st.sampled_from(["tokens", "batch", "domain", "open", "args", "é"]),
                            json_values, min_size=1, max_size=4))  # fmt: skip
def test_user_args_are_written_and_read_back(
    tmp_path_factory: pytest.TempPathFactory, args: dict[str, object]
) -> None:
    rec = RangeRecord("gen", "verl", T0, T0 + 5, 1, 2, True, args)
    mark = InstantRecord("sync", "verl", T0 + 1, 1, 2, args)
    path = tmp_path_factory.mktemp("a") / "r.trace.json"
    doc = chrome_trace([RankTrace(0, [rec, mark])])
    (ev,) = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert ev["args"]["domain"] == "verl" and ev["args"]["open"] is True
    if {"domain", "open", "args"} & set(args):  # the user's keys never overwrite ours
        assert ev["args"]["args"] == args
    else:
        assert {k: ev["args"][k] for k in args} == args
    write_chrome_trace(path, [RankTrace(0, [rec, mark])])
    (back,) = read_chrome_trace(path)
    assert [r.args for r in back.records] == [args, args]
    assert back.ranges[0].open and back.ranges[0].domain == "verl"


def test_args_json_cannot_hold_are_written_as_text(tmp_path: Path) -> None:
    rec = RangeRecord("gen", "default", T0, T0 + 5, 1, 2, args={"path": Path("/x"), "n": 3})
    (back,) = read_chrome_trace(
        write_chrome_trace(tmp_path / "a.trace.json", [RankTrace(0, [rec])])
    )
    assert back.records[0].args == {"path": "/x", "n": 3}
    assert chrome_trace([RankTrace(0, [rng("a", 0, 1)])])["traceEvents"][-1]["args"] == {
        "domain": "default"
    }


def test_a_clock_pair_is_written(tmp_path: Path) -> None:
    before = time.time_ns()
    clock = chrome_trace([synthetic_rank(0)])["otherData"]["clock"]
    assert before <= clock["wall_ns"] <= time.time_ns() and clock["mono_ns"] <= time.monotonic_ns()


def test_json_nested_too_deeply_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "deep.trace.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TraceFileError, match="nested too deeply") as info:
        read_chrome_trace(path)
    assert info.value.path == path


def test_the_streamed_file_is_the_document_chrome_trace_builds(tmp_path: Path) -> None:
    import json

    from mstx_marks.base.records import InstantRecord, RangeRecord, RankTrace
    from mstx_marks.export.chrome import chrome_trace, dumps, write_chrome_trace

    recs = [
        RangeRecord('gen é"x', "verl", 1_000_000_123_456, 1_000_000_987_654, 7, 42),
        InstantRecord("tick", "default", 1_000_000_500_000, 7, 42),
        RangeRecord("open", "verl", 1_000_000_600_000, 1_000_001_000_000, 8, 42, True),
        RangeRecord("a", "verl", 1_000_000_600_001, 1_000_001_000_000, 8, 43, False, {"n": 3}),
    ] * 3000  # more than one write batch
    for traces in ([RankTrace(0, recs, [(1, 2)], role="trainer"), RankTrace(1, recs[:2])], []):
        path = write_chrome_trace(tmp_path / "t.json", traces)
        streamed, built = json.loads(path.read_text()), json.loads(dumps(chrome_trace(traces)))
        streamed["otherData"].pop("clock")
        built["otherData"].pop("clock")
        assert streamed == built
