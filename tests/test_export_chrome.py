from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from support.recorded import T0, records, rng, synthetic_rank

from mstx_marks.export import RankTrace, TraceFileError, read_chrome_trace, write_chrome_trace
from mstx_marks.export.chrome import chrome_trace
from mstx_marks.records import Record


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
    assert doc["otherData"]["origin_ns"] == T0 // 10**9 * 10**9


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
