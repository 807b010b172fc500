"""Issue 20, item 14 ("Memory is not bounded"): a spill or Chrome trace too large to hold is
summarised in one pass (:mod:`mstx_marks.analysis.readers.stream`) with the figures the in-memory
path
gives, says what it cannot give, is refused by the timelines with its name, and stays in bounded
memory; ``summary`` reads as many files at once as its memory budget allows.

The limits are patched down so that small files (written by the real writers) take the
streaming paths; a test builds a spill past the real size limit and checks that the command, by
the real limits, streams it and counts every event; another runs the command on a Chrome trace
past its limits (lowered in its process: by the real ones, a million events). How much memory
it takes, and the real limits at a real scale, are a benchmark's, not a unit test's (machines
differ): ``python3 benchmarks/summary_memory.py --check`` (and ``3e6``, ``1.1e6 --chrome``).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mstx_marks.analysis import readers
from mstx_marks.analysis import summary as summary_module
from mstx_marks.analysis.model.aggregate import SAMPLE_LIMIT, ProcessPart
from mstx_marks.analysis.model.quantiles import RELATIVE_ERROR
from mstx_marks.analysis.readers import (
    chrome_json,
    part_of_file,
    peak_estimate,
    read_trace_file,
    stream,
)
from mstx_marks.analysis.summary import (
    format_json,
    format_table,
    load_traces,
    memory_jobs,
    run_summary,
    summarize_path,
)
from mstx_marks.backends.record import Recorder
from mstx_marks.base.records import Member, TraceFileError
from mstx_marks.export.chrome import write_chrome_trace
from mstx_marks.export.spill import Spill, read_spill

#: Ranges of the one phase that passes SAMPLE_LIMIT (its p50/p90 then come from the sketch).
DECODES = 90
STEPS = 300


def write_spill(
    out: Path, *, keyed: bool = False, rank: int = 0, role: str = "trainer", steps: int = STEPS
) -> Path:
    """A spill by the real writer: ``steps`` train steps (two ranges per step key when
    ``keyed``), each a gen range of DECODES decode ranges and a ``sync_start``/``sync_stop``
    pair of marks; and one stop mark with no start."""
    rec = Recorder(capacity=1 << 20)
    spill = Spill(out, rec, rank=rank, role=role)
    start, end = rec.range_start, rec.range_end
    for k in range(steps):
        step = start("train_step", "default")
        if keyed:
            rec.set_args(step, {"step": k // 2})
        gen = start("gen", "default")
        for _ in range(DECODES):
            end(start("vllm_one_step", "vllm"), "vllm")
        end(gen, "default")
        rec.instant("sync_start", "default")
        rec.instant("sync_stop", "default")
        end(step, "default")
    rec.instant("lonely_stop", "default")
    return spill.write_now(final=True)


def limit(monkeypatch: pytest.MonkeyPatch, events: int, size: int = stream.MAX_SPILL_BYTES) -> None:
    monkeypatch.setattr(stream, "MAX_HELD_EVENTS", events)
    monkeypatch.setattr(stream, "MAX_SPILL_BYTES", size)


def assert_same(held: ProcessPart, streamed: ProcessPart, marks: bool = True) -> None:
    """Every figure of the in-memory part but the breakdown: exact, p50/p90 within the sketch's
    bound where they come from it (and exact where the phase is short); with ``marks``, the
    start/stop marks paired in both."""
    assert not held.streamed and streamed.streamed
    for field in (
        "rank", "role", "pids", "source", "n_records", "span", "first_ns", "step_count",
        "step_time_ns", "step_keys", "step_phases", "run", "instance", "dropped", "skipped",
        "complete",
    ):  # fmt: skip
        assert getattr(streamed, field) == getattr(held, field), field
    assert streamed.phases.keys() == held.phases.keys()
    for name, a in held.phases.items():
        b = streamed.phases[name]
        assert (b.count, b.total_ns, b.max_ns, b.first_start_ns) == (
            a.count, a.total_ns, a.max_ns, a.first_start_ns,
        ), name  # fmt: skip
        if a.count <= SAMPLE_LIMIT:
            assert (b.p50_ns, b.p90_ns, b.percentile_error) == (a.p50_ns, a.p90_ns, 0), name
        else:
            assert b.percentile_error == RELATIVE_ERROR and b.sample is None
            for got, exact in ((b.p50_ns, a.p50_ns), (b.p90_ns, a.p90_ns)):
                assert abs(got - exact) <= RELATIVE_ERROR * exact + 1e-9, (name, got, exact)
    assert held.phases["vllm_one_step"].count == STEPS * DECODES > SAMPLE_LIMIT
    if marks:
        assert held.phases["sync"].count == STEPS  # the marks paired, in both


@pytest.mark.parametrize("keyed", [False, True], ids=["numbered", "keyed"])
def test_a_spill_past_the_limits_is_streamed_with_the_same_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keyed: bool
) -> None:
    path = write_spill(tmp_path, keyed=keyed)
    (held,) = part_of_file(path)
    assert held.step_count == (STEPS // 2 if keyed else STEPS)
    assert held.step_keys == ([str(k) for k in range(STEPS // 2)] if keyed else [])
    assert held.phases["generate_sequences"].self_ns > 0  # the breakdown, held
    assert_same(held, stream.aggregate_spill_stream(path))
    limit(monkeypatch, events=1000)  # held, then past the count: streamed from there
    (past_count,) = part_of_file(path)
    assert_same(held, past_count)
    limit(monkeypatch, events=10**9, size=path.stat().st_size - 1)  # past the size: from the start
    (past_size,) = part_of_file(path)
    assert_same(held, past_size)
    assert past_size.unmarked_ns == past_size.concurrent_ns == 0
    assert all(a.self_ns == 0 for a in past_size.phases.values())  # not known, never a guess


def test_b_the_summary_says_what_a_streamed_process_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_spill(tmp_path)
    member = Member("trainer", 0)
    normal = summarize_path(tmp_path, jobs=1, progress=False)
    assert not normal.notes and member in normal.unmarked_ns
    gen = next(p for p in normal.phases if p.name == "generate_sequences")
    assert gen.per_rank[0].self_share is not None and gen.overall.self_share is not None

    limit(monkeypatch, events=1000)
    streamed = summarize_path(tmp_path, jobs=1, progress=False)
    (note,) = streamed.notes
    assert str(path) in note and "summarised in one pass" in note and "self times" in note
    assert member not in streamed.unmarked_ns
    gen = next(p for p in streamed.phases if p.name == "generate_sequences")
    assert gen.per_rank[0].self_share is None and gen.overall.self_share is None  # not "0 %"
    assert gen.overall.count == STEPS and streamed.step_count[member] == STEPS
    table = format_table(streamed)
    (row,) = [line for line in table.splitlines() if line.startswith("generate_sequences")]
    assert row.split()[9] == "-", row  # the self % column
    (unmarked,) = [line for line in table.splitlines() if line.startswith("(unmarked)")]
    assert unmarked.split()[2:] == ["-", "-", "-"], unmarked
    assert "not known for trainer rank 0" in table
    doc = format_json(streamed)
    assert doc["ranks"]["trainer:0"]["unmarked_ns"] is None and doc["notes"] == [note]


def test_b_one_process_in_two_large_spills_is_joined_in_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two spills of one role and rank (two processes: same host and pid, two instances) are
    read again to be summed (``_rank_job``); past the limits, in one pass, with the same sums."""
    write_spill(tmp_path, steps=200)
    write_spill(tmp_path, steps=100)
    assert len(list((tmp_path / "spill").iterdir())) == 2
    member = Member("trainer", 0)
    held = summarize_path(tmp_path, jobs=1, progress=False)
    limit(monkeypatch, events=1000)
    streamed = summarize_path(tmp_path, jobs=1, progress=False)
    assert not held.errors and not streamed.errors, streamed.errors
    assert held.step_count[member] == streamed.step_count[member] == 300
    assert held.step_time_ns[member] == streamed.step_time_ns[member]
    for a, b in zip(held.phases, streamed.phases):
        assert (a.name, a.overall.count, a.overall.total_ns, a.overall.max_ns) == (
            b.name, b.overall.count, b.overall.total_ns, b.overall.max_ns,
        )  # fmt: skip
    assert member in held.unmarked_ns and member not in streamed.unmarked_ns
    (note,) = streamed.notes  # one process of two files: every event of both counted
    assert f"{300 * (DECODES + 3) + 2} events" in note, note


def test_c_timelines_name_a_spill_too_large_and_draw_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    big = write_spill(tmp_path, rank=0, role="trainer")
    small = write_spill(tmp_path, rank=1, role="trainer", steps=2)
    small_events = len(read_spill(small).records)
    limit(monkeypatch, events=small_events)
    with pytest.raises(TraceFileError, match="more than is read whole here") as refused:
        read_trace_file(big)
    assert refused.value.path == big
    assert len(read_trace_file(small)[0].records) == small_events - 2  # a pair made one range

    traces, errors, _ = load_traces(tmp_path)
    assert [t.rank for t in traces] == [1] and len(errors) == 1 and str(big) in errors[0]
    html, trace = tmp_path / "report.html", tmp_path / "job.trace.json"
    code = run_summary(str(tmp_path), html=str(html), trace=str(trace))
    err = capsys.readouterr().err
    assert code == 1  # an error: the big spill is not in the pictures
    assert f"error: {big}" in err and "without them summarises it in one pass" in err
    assert html.is_file() and "vllm_one_step" in html.read_text(encoding="utf-8")
    events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
    ranks = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert ranks and all("rank 1" in r for r in ranks), ranks

    assert run_summary(str(tmp_path), jobs=1) == 0  # without pictures: both, the big one streamed
    out, err = capsys.readouterr()
    assert "rank 0:" in out and "rank 1:" in out and "summarised in one pass" in err


# A real large spill, by the real limits: its steps carry a long argument (a prompt), so that
# few events make a spill past MAX_SPILL_BYTES.
_BUILD = """
import sys
from mstx_marks.backends.record import Recorder
from mstx_marks.export.spill import Spill
rec = Recorder(capacity=1 << 20)
spill = Spill(sys.argv[1], rec, rank=0, role="trainer")
start, end = rec.range_start, rec.range_end
prompt = "x" * int(sys.argv[3])
for n in range(int(sys.argv[2]) // 10):
    step = start("step", "default")
    rec.set_args(step, {"prompt": prompt})
    for _ in range(9):
        end(start("vllm_one_step", "vllm"), "vllm")
    end(step, "default")
    if n % 2_000 == 1_999:
        spill.write_now()
spill.write_now(final=True)
"""
EVENTS, PROMPT = 50_000, 16_000

# The command in a process of its own, its limits lowered first (a million events by the real
# ones): ``summary_json(..., lowered=...)``.
_LOWERED = """
import sys
from mstx_marks.analysis.readers import chrome_json, stream
stream.MAX_HELD_EVENTS, chrome_json.WHOLE_JSON_BYTES = int(sys.argv[1]), int(sys.argv[2])
from mstx_marks.cli.main import main
sys.exit(main(sys.argv[3:]))
"""


def summary_json(
    folder: Path, lowered: tuple[int, int] | None = None
) -> tuple[dict[str, Any], str]:
    """``mstx-marks summary FOLDER --json``, run as a user runs it: its JSON and its stderr; with
    ``lowered``, its MAX_HELD_EVENTS and WHOLE_JSON_BYTES set to those first."""
    command = ["summary", str(folder), "--json"]
    if lowered is None:
        command = [sys.executable, "-m", "mstx_marks", *command]
    else:
        limits = [str(n) for n in lowered]
        command = [sys.executable, "-c", textwrap.dedent(_LOWERED), *limits, *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc, proc.stderr


def test_d_a_large_spill_is_streamed_and_every_event_counted(tmp_path: Path) -> None:
    """A spill past MAX_SPILL_BYTES (50,000 events, each step with a 16 kB prompt: 82 MB) is
    streamed by the real limits, every event counted. (Of 3e6 events, 90 MB: holding them would
    take about 1.7 GB, 590 MB per million; streamed, 111 MB: ``benchmarks/summary_memory.py 3e6
    --check``.)"""
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_BUILD), str(tmp_path), str(EVENTS), str(PROMPT)],
        check=True, timeout=300,
    )  # fmt: skip
    (spill,) = (tmp_path / "spill").iterdir()
    assert spill.stat().st_size > stream.MAX_SPILL_BYTES  # (past the real limit)
    summary, stderr = summary_json(tmp_path)
    assert sum(p["all"]["count"] for p in summary["phases"]) == EVENTS, stderr
    assert summary["ranks"]["trainer:0"]["steps"] == EVENTS // 10
    assert "summarised in one pass" in stderr


# Chrome traces (issue 20 item 14, continued): a JSON file too large to parse whole is read an
# event at a time (chrome_json.WHOLE_JSON_BYTES), its records held up to MAX_HELD_EVENTS, else
# summarised in one pass. The thresholds are patched down so that small files take each path.


def write_ours(folder: Path, name: str, *ranks: int, steps: int = STEPS) -> Path:
    """One of our Chrome traces holding ``ranks`` (each as :func:`write_spill` records it),
    written by the real exporter."""
    traces = []
    for rank in ranks:
        spill = write_spill(folder.parent / f"src-{name}-{rank}", rank=rank, steps=steps)
        traces.append(read_spill(spill))
    return write_chrome_trace(folder / name, traces)


def write_plain(path: Path, steps: int = STEPS) -> Path:
    """Another tool's Chrome trace (epoch microseconds): each step a ``B``/``E`` pair round a gen
    range (``X``) of DECODES decode ranges, and a ``sync_start``/``sync_stop`` pair of instants;
    one stop alone."""
    ev = lambda ph, name, ts, **more: {"ph": ph, "name": name, "pid": 5, "tid": 6, "ts": ts, **more}  # noqa: E731
    events: list[dict[str, object]] = [
        {"ph": "M", "name": "process_name", "pid": 5, "args": {"name": "python"}}
    ]
    for k in range(steps):
        t = 1.7e15 + 1000.0 * k  # (exact to a quarter of a microsecond)
        events.append(ev("B", "train_step", t))
        events.append(ev("X", "gen", t + 1, dur=3.0 * DECODES + 1))
        events += [
            ev("X", "vllm_one_step", t + 1.5 + 3 * d, dur=1 + (k * 7 + d) % 11 / 8, cat="vllm")
            for d in range(DECODES)
        ]
        events += [ev("i", "sync_start", t + 900, s="t"), ev("i", "sync_stop", t + 950.5, s="t")]
        events.append(ev("E", "train_step", t + 990.25))
    events.append(ev("i", "lonely_stop", 1.7e15 + 1000.0 * steps))
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return path


def write_kineto(path: Path, steps: int = STEPS) -> Path:
    """A torch.profiler trace (gzip): ``ProfilerStep#N`` and ``record_function`` ranges among
    ops, ``baseTimeNanoseconds`` after the events (so it must be known before them)."""
    ann = {"ph": "X", "cat": "user_annotation", "pid": 9, "tid": 9}
    events: list[dict[str, object]] = []
    for k in range(steps):
        t = 1000.0 * k
        events.append({**ann, "name": f"ProfilerStep#{k}", "ts": t, "dur": 990.0})
        events.append({**ann, "name": "gen", "ts": t + 1, "dur": 3.0 * DECODES + 1})
        for d in range(DECODES):
            dur = 1 + (k * 7 + d) % 11 / 8
            events.append({**ann, "name": "vllm_one_step", "ts": t + 1.5 + 3 * d, "dur": dur})
            op = {"name": "aten::mm", "ts": t + 1.5 + 3 * d, "args": {"Input Dims": [[8, 8]]}}
            events.append({**ann, **op, "cat": "cpu_op", "dur": 0.5})
    doc = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events,
           "traceName": str(path), "baseTimeNanoseconds": 1_700_000_000_000_000_000}  # fmt: skip
    with gzip.open(path, "wt") as f:
        json.dump(doc, f, indent=1)  # (Kineto writes its events a line each)
    return path


def stream_json(monkeypatch: pytest.MonkeyPatch, whole: int = 4096) -> None:
    """Files past ``whole`` bytes of JSON are read an event at a time (each value within it)."""
    monkeypatch.setattr(chrome_json, "WHOLE_JSON_BYTES", whole)


def assert_identical(a: ProcessPart, b: ProcessPart) -> None:
    """The same part, self times and all (the records held either way)."""
    assert not a.streamed and not b.streamed
    strip = lambda p: {**vars(p), "phases": None}  # noqa: E731
    assert strip(a) == strip(b)
    fields = ("count", "total_ns", "max_ns", "p50_ns", "p90_ns", "first_start_ns", "self_ns",
              "percentile_error")  # fmt: skip
    for name, x in a.phases.items():
        y = b.phases[name]
        assert [getattr(x, f) for f in fields] == [getattr(y, f) for f in fields], name
        assert list(x.sample or []) == list(y.sample or []), name


@pytest.mark.parametrize("kind", ["ours", "plain", "kineto"])
def test_e_a_large_chrome_trace_gives_the_figures_of_the_whole_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Ours (two ranks in one file: two parts), another tool's with B/E pairs, instants and X
    events, and torch.profiler's: read whole, read an event at a time and held (the very same
    parts), and past the held limit in one pass (the figures ``assert_same`` holds)."""
    folder = tmp_path / "run"
    folder.mkdir()
    if kind == "ours":
        path = write_ours(folder, "job.trace.json", 0, 1)
    elif kind == "plain":
        path = write_plain(folder / "trace.json")
    else:
        path = write_kineto(folder / "k.pt.trace.json.gz")
    whole = part_of_file(path)
    assert len(whole) == (2 if kind == "ours" else 1)
    assert all(p.phases["generate_sequences"].self_ns > 0 for p in whole)  # the breakdown
    assert all(p.step_count == STEPS for p in whole)

    calls: list[Path] = []
    real = chrome_json.stream_trace_json
    monkeypatch.setattr(readers, "stream_trace_json", lambda p: calls.append(p) or real(p))
    stream_json(monkeypatch)
    held = part_of_file(path)
    assert calls == [path]  # read an event at a time
    for a, b in zip(whole, held, strict=True):
        assert_identical(a, b)

    limit(monkeypatch, events=1000)
    streamed = part_of_file(path)
    for a, b in zip(whole, streamed, strict=True):
        assert_same(a, b, marks=kind != "kineto")  # (Kineto's instants are not read)


def test_e_a_streamed_chrome_trace_is_noted_and_the_rest_summarised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    big = write_ours(folder, "big.trace.json", 0)
    write_plain(folder / "rank1.trace.json", steps=3)  # another process: rank 1 by its name
    stream_json(monkeypatch)
    limit(monkeypatch, events=1000)
    summary = summarize_path(folder, jobs=1, progress=False)
    assert not summary.errors, summary.errors
    (note,) = summary.notes
    assert str(big) in note and "summarised in one pass" in note and "self times" in note
    assert summary.step_count == {Member("trainer", 0): STEPS, Member("", 1): 3}
    assert Member("", 1) in summary.unmarked_ns and Member("trainer", 0) not in summary.unmarked_ns


def test_e_one_process_in_two_large_chrome_traces_is_joined_in_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes of one role and rank, each in a Chrome trace of its own, are read again to
    be summed; past the limits, in one pass (``streams_of_file``), with the same sums."""
    folder = tmp_path / "run"
    folder.mkdir()
    write_ours(folder, "a.trace.json", 0, steps=200)
    write_ours(folder, "b.trace.json", 0, steps=100)
    member = Member("trainer", 0)
    held = summarize_path(folder, jobs=1, progress=False)
    stream_json(monkeypatch)
    limit(monkeypatch, events=1000)
    streamed = summarize_path(folder, jobs=1, progress=False)
    assert not held.errors and not streamed.errors, streamed.errors
    assert held.step_count[member] == streamed.step_count[member] == 300
    assert held.step_time_ns[member] == streamed.step_time_ns[member]
    for a, b in zip(held.phases, streamed.phases, strict=True):
        assert (a.name, a.overall.count, a.overall.total_ns, a.overall.max_ns) == (
            b.name, b.overall.count, b.overall.total_ns, b.overall.max_ns,
        )  # fmt: skip
    assert member in held.unmarked_ns and member not in streamed.unmarked_ns


@pytest.mark.parametrize("parse", ["whole", "an event at a time"])
def test_f_timelines_name_a_chrome_trace_too_large_and_draw_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parse: str
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    big = write_ours(folder, "big.trace.json", 0)
    small = write_plain(folder / "rank1.trace.json", steps=2)
    if parse != "whole":
        stream_json(monkeypatch)
    limit(monkeypatch, events=2 * (DECODES + 4) + 1)  # the small one's events, to the last
    with pytest.raises(stream.TooLargeToHold, match="more than is read whole here") as refused:
        read_trace_file(big)
    assert refused.value.path == big
    assert len(read_trace_file(small)[0].records) == 2 * (DECODES + 3) + 1  # a pair made a range
    traces, errors, _ = load_traces(folder)
    assert [t.rank for t in traces] == [1] and len(errors) == 1 and str(big) in errors[0]


def test_f_a_chrome_trace_past_what_is_read_at_all_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bounds of reading an event at a time: the whole text, its events, and one value in
    it; and a torn file."""
    path = write_ours(tmp_path, "a.trace.json", 0, steps=20)
    stream_json(monkeypatch)
    monkeypatch.setattr(chrome_json, "MAX_STREAMED_JSON_BYTES", path.stat().st_size - 1)
    with pytest.raises(TraceFileError, match="more than 0 MB of JSON, more than is read here"):
        part_of_file(path)
    monkeypatch.setattr(chrome_json, "MAX_STREAMED_JSON_BYTES", path.stat().st_size)
    assert part_of_file(path)[0].step_count == 20
    events = len(json.loads(path.read_text())["traceEvents"])
    monkeypatch.setattr(chrome_json, "MAX_STREAMED_EVENTS", events - 1)
    with pytest.raises(TraceFileError, match=f"more than {events - 1} events, more than is read"):
        part_of_file(path)
    monkeypatch.setattr(chrome_json, "MAX_STREAMED_EVENTS", events)
    assert part_of_file(path)[0].step_count == 20
    stream_json(monkeypatch, whole=64)  # an event is longer than this
    monkeypatch.setattr(chrome_json, "_CHUNK", 16)  # (read in chunks shorter than an event)
    with pytest.raises(TraceFileError, match=r"one value .* more than 0 MB"):
        part_of_file(path)
    stream_json(monkeypatch)
    assert part_of_file(path)[0].step_count == 20  # (every event across chunks of 16)
    torn = tmp_path / "torn.trace.json"
    torn.write_text(path.read_text()[:-100])
    with pytest.raises(TraceFileError, match=r"torn.trace.json: is not valid JSON \(truncated"):
        part_of_file(torn)


def test_g_the_files_read_at_once_keep_within_the_memory_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Estimates by kind and size (files made sparse: only their size matters), the workers
    they allow, and ``summarize_path`` using them unless told how many."""
    mb = 1 << 20

    def sized(name: str, size: int) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(size)
        return path

    small_db = peak_estimate(sized("a/ascend_pytorch_profiler_0.db", 5 * mb))
    small_json = peak_estimate(sized("r0.trace.json", 5 * mb))
    big_json = peak_estimate(sized("r1.trace.json", 200 * mb))
    big_gz = peak_estimate(sized("k.pt.trace.json.gz", 20 * mb))
    held_spill = peak_estimate(sized("spill/h-1.jsonl", 40 * mb))
    streamed_spill = peak_estimate(sized("spill/h-2.jsonl", stream.MAX_SPILL_BYTES + 1))
    assert 30 * mb < small_db < 80 * mb and 30 * mb < small_json < 80 * mb
    assert 500 * mb < big_json == big_gz == held_spill < 700 * mb  # a million records held
    assert streamed_spill < 50 * mb
    assert memory_jobs([small_db] * 64, cpus=16) == 16  # a 64-rank run: every CPU
    assert memory_jobs([big_json, small_db, small_db], cpus=16) == 3
    assert memory_jobs([big_json, held_spill, small_db], cpus=16) == 1
    assert memory_jobs([2 * big_json], cpus=4) == 1 and memory_jobs([], cpus=4) == 1

    asked: list[int | None] = []
    real_map = summary_module.map_files

    def spy(fn: Any, items: Any, jobs: int | None = None, progress: Any = None) -> Any:
        if fn is summary_module._part_job:  # (not the members read again: none here)
            asked.append(jobs)
        return real_map(fn, items, 1, progress)

    monkeypatch.setattr(summary_module, "map_files", spy)
    monkeypatch.setattr(summary_module, "default_jobs", lambda: 8)
    folder = tmp_path / "run"
    folder.mkdir()
    for rank in range(10):
        write_plain(folder / f"rank{rank}.trace.json", steps=2)
    summarize_path(folder, progress=False)
    summarize_path(folder, progress=False, jobs=5)
    monkeypatch.setattr(summary_module, "peak_estimate", lambda path: 600 * mb)
    summarize_path(folder, progress=False)
    assert asked == [8, 5, 1]


# A large Chrome trace.
_BUILD_CHROME = """
import sys
from mstx_marks.base.records import RangeRecord, RankTrace
from mstx_marks.export.chrome import write_chrome_trace
t0, records = 2 * 10**18, []
for n in range(int(sys.argv[2]) // 10):
    t = t0 + n * 10_000
    records.append(RangeRecord("step", "default", t, t + 9_000, 1, 7))
    records += [RangeRecord("vllm_one_step", "vllm", t + 100 + 900 * d, t + 900 * (d + 1), 1, 7)
                for d in range(9)]
write_chrome_trace(sys.argv[1] + "/rank0.trace.json", [RankTrace(0, records, role="trainer")])
"""
#: Its events, and the limits of the command reading it: a tenth past those held.
CHROME_EVENTS, HELD, WHOLE = 11_000, 10_000, 64 << 10


def test_h_a_large_chrome_trace_is_streamed_and_every_event_counted(tmp_path: Path) -> None:
    """A trace past every threshold (read an event at a time, its first HELD records held, then
    streamed) is counted whole by the command. By the real limits, 1.1e6 events (117 MB of
    JSON): parsed whole and aggregated they took 1.47 GB (measured), read so 291 MB
    (``benchmarks/summary_memory.py 1.1e6 --chrome --check``)."""
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_BUILD_CHROME), str(tmp_path), str(CHROME_EVENTS)],
        check=True, timeout=300,
    )  # fmt: skip
    assert (tmp_path / "rank0.trace.json").stat().st_size > WHOLE
    summary, stderr = summary_json(tmp_path, lowered=(HELD, WHOLE))
    assert sum(p["all"]["count"] for p in summary["phases"]) == CHROME_EVENTS, stderr
    assert summary["ranks"]["trainer:0"]["steps"] == CHROME_EVENTS // 10
    assert "summarised in one pass" in stderr


# --- databases --------------------------------------------------------------------------------


def write_db(out: Path) -> Path:
    """The spill of :func:`write_spill` as an Ascend database, by the real exporter."""
    from mstx_marks.export import ascend_db_path, write_ascend_db

    trace = read_spill(write_spill(out))
    return write_ascend_db(ascend_db_path(out, trace.rank), trace)


def test_a_database_past_the_limit_is_streamed_with_the_same_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Summarised in SQL up to MAX_HELD_EVENTS rows (its rows fetched whole: 540 MB a million),
    its rows streamed from the cursor past that (1111 MB peak for 2e6 events before)."""
    from mstx_marks.export import read_ascend_db

    db = write_db(tmp_path)
    (held,) = part_of_file(db)
    limit(monkeypatch, 1000)
    (streamed,) = part_of_file(db)
    assert streamed.n_records > 1000
    assert_same(held, streamed)
    got: list[Any] = []
    trace = read_ascend_db(db, sink=got.append)
    assert trace.records == [] and got == read_ascend_db(db).records


def test_timelines_name_a_database_too_large_and_summary_still_counts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = write_db(tmp_path)
    limit(monkeypatch, 1000)
    with pytest.raises(stream.TooLargeToHold, match="holds more than 1000 events") as e:
        read_trace_file(db)
    assert str(db) in str(e.value)
    summary = summarize_path(db, jobs=1, progress=False)
    assert summary.errors == []
    assert sum(p.overall.count for p in summary.phases) > 1000
    assert any("summarised in one pass" in n for n in summary.notes), summary.notes


# --- the incremental JSON parser against json.loads ------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
_DOCS = st.one_of(
    st.lists(_JSON, max_size=6),
    st.tuples(
        st.dictionaries(
            st.text(max_size=5).filter(lambda k: k != "traceEvents"), _JSON, max_size=3
        ),
        st.lists(_JSON, max_size=6),
        st.dictionaries(
            st.text(max_size=5).filter(lambda k: k != "traceEvents"), _JSON, max_size=3
        ),
    ).map(
        lambda t: {**t[0], "traceEvents": t[1], **{k: v for k, v in t[2].items() if k not in t[0]}}
    ),
)


def _streamed(path: Path) -> Any:
    doc = chrome_json.stream_trace_json(path)
    if isinstance(doc, chrome_json.JsonEvents):
        return list(doc)
    if "traceEvents" in doc:
        doc["traceEvents"] = list(doc["traceEvents"])
    return doc


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=_DOCS, chunk=st.integers(1, 64), indent=st.sampled_from([None, 1]), cut=st.floats(0, 1))
def test_the_incremental_parser_reads_what_json_loads_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, doc: Any, chunk: int, indent: Any, cut: float
) -> None:
    """Valid text gives json.loads's document, in chunks of 1 to 64 characters; text cut short
    or spoiled gives an error naming the file exactly when json.loads refuses it."""
    monkeypatch.setattr(chrome_json, "_CHUNK", chunk)
    path = tmp_path / "t.trace.json"
    text = json.dumps(doc, indent=indent, ensure_ascii=False)
    path.write_text(text, encoding="utf-8")
    assert _streamed(path) == json.loads(text)
    spoiled = text[: int(len(text) * cut)] if cut < 0.5 else text[: int(len(text) * cut)] + "x"
    path.write_text(spoiled, encoding="utf-8")
    try:
        expected = json.loads(spoiled)
    except ValueError:
        with pytest.raises(TraceFileError, match=str(path)):
            _streamed(path)
    else:
        if isinstance(expected, (dict, list)):
            assert _streamed(path) == expected
