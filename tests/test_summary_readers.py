"""Every trace a user has, read by `summary`: torch.profiler's (generated here with the real CPU
profiler), torch_npu's text layout (from its documented shape), any Chrome trace, ours, and a
tree mixing them; steps from ProfilerStep#N, STEP_TIME or a named phase; start/stop marks."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from support.recorded import PID, T0, TID, rng, synthetic_rank

from mstx_marks.analysis.model.steps import StepOptions
from mstx_marks.analysis.readers import find_trace_files, read_trace_file
from mstx_marks.analysis.render.timeline import render_svg
from mstx_marks.analysis.summary import load_traces, summarize_path
from mstx_marks.base.records import InstantRecord, Member, RangeRecord
from mstx_marks.cli.main import main as cli_main
from mstx_marks.export import RankTrace, export_rank, write_ascend_db, write_chrome_trace


def M(rank: int, role: str = "") -> Member:
    return Member(role, rank)


def _torch_profile(out: Path, steps: int = 3) -> Path:
    """A real torch.profiler CPU trace: a scheduled profiler (so ProfilerStep#N is recorded)
    around record_function ranges."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    out.mkdir(parents=True, exist_ok=True)
    path = out / "worker0.123.pt.trace.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=steps),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(steps + 2):
            with record_function("train_step"):
                with record_function("forward"):
                    torch.ones(64).sum()
                with record_function("update_actor"):
                    torch.ones(64).mul(2)
            prof.step()
    return path


def test_a_real_torch_profiler_trace_is_read_with_its_steps(tmp_path: Path) -> None:
    path = _torch_profile(tmp_path)
    (trace,) = read_trace_file(path)
    names = [r.name for r in trace.ranges]
    assert names.count("forward") == 3 and names.count("train_step") == 3
    assert "aten::ones" not in names  # operators are not phases
    steps = [r for r in trace.ranges if r.name == "ProfilerStep"]
    assert len(steps) == 3 and all(r.args and isinstance(r.args["step"], int) for r in steps)
    assert min(r.start_ns for r in trace.ranges) > 10**18  # on the wall clock
    assert trace.ranges[0].pid == os.getpid()
    summary = summarize_path(tmp_path, jobs=1)
    assert summary.errors == [] and summary.step_count == {M(0): 3}
    keys = [str(r.args["step"]) for r in steps if r.args]
    assert summary.step_keys[M(0)] == keys and keys[0] != "1"  # the profiler's own step numbers
    fwd = next(p for p in summary.phases if p.name == "forward")
    assert fwd.overall.count == 3
    # A user-named step phase instead: its three ranges are the steps.
    named = summarize_path(tmp_path, StepOptions("train_step"), jobs=1)
    assert named.step_count == {M(0): 3} and named.step_keys[M(0)] == []  # numbered 1, 2, 3
    # gzip-compressed, as tensorboard_trace_handler(use_gzip=True) writes it
    gz = tmp_path / "gz" / "w.pt.trace.json.gz"
    gz.parent.mkdir()
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert len(read_trace_file(gz)[0].ranges) == len(trace.ranges)


def _trace_view(folder: Path, rank: int) -> Path:
    """torch_npu's text export, in the shape its TraceEventManager writes: a list of events,
    ts as strings of microseconds with three decimals, dur a float; MSTX ranges in category
    MsTx, operators as cpu_op, ProfilerStep#N among them, metadata naming processes."""
    out = folder / "host_1_20250101000000000_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out.parent / f"profiler_info_{rank}.json").write_text("{}")
    us = lambda ns: f"{(T0 + ns) // 1000}.{(T0 + ns) % 1000:03d}"  # noqa: E731
    events = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "Python"}},
        {"ph": "X", "name": "ProfilerStep#7", "pid": PID, "tid": TID, "ts": us(0),
         "dur": 1000.0, "cat": "cpu_op", "args": {}},
        {"ph": "X", "name": "aten::add", "pid": PID, "tid": TID, "ts": us(5), "dur": 0.1,
         "cat": "cpu_op", "args": {}},
        {"ph": "X", "name": "generate_sequences", "pid": PID, "tid": TID, "ts": us(10),
         "dur": 0.5, "cat": "MsTx", "args": {}},
        {"ph": "X", "name": "update_actor", "pid": PID, "tid": TID, "ts": us(700),
         "dur": 0.29, "cat": "MsTx", "args": {}},
        {"ph": "s", "name": "mstx", "id": "1", "pid": PID, "tid": TID, "ts": us(10), "cat": "MsTx"},
    ]  # fmt: skip
    path = out / "trace_view.json"
    path.write_text(json.dumps(events))
    return path


def test_torch_npu_text_layout_is_read(tmp_path: Path) -> None:
    path = _trace_view(tmp_path, rank=5)
    assert find_trace_files(tmp_path) == [path]
    (trace,) = read_trace_file(path)
    assert trace.rank == 5
    by_name = {r.name: r for r in trace.ranges}
    assert set(by_name) == {"ProfilerStep", "generate_sequences", "update_actor"}
    assert by_name["generate_sequences"].start_ns == T0 + 10  # every nanosecond of the string
    assert by_name["generate_sequences"].duration_ns == 500
    summary = summarize_path(tmp_path, jobs=1)
    assert summary.step_keys == {M(5): ["7"]} and summary.step_time_ns == {M(5): 1_000_000}


def test_any_chrome_trace_and_the_demos_plain_trace_json(tmp_path: Path) -> None:
    ours = tmp_path / "ours"
    write_chrome_trace(ours / "trace.json", [synthetic_rank(0), synthetic_rank(1)])
    traces, errors, _ = load_traces(ours)
    assert errors == [] and [t.rank for t in traces] == [0, 1]
    other = tmp_path / "other" / "trace.json"
    other.parent.mkdir()
    other.write_text(json.dumps({"traceEvents": [
        {"ph": "B", "name": "rollout", "pid": 3, "tid": 4, "ts": 1.0},
        {"ph": "X", "name": "reward", "pid": 3, "tid": 4, "ts": 2.0, "dur": 0.5},
        {"ph": "E", "pid": 3, "tid": 4, "ts": 4.0},
        {"ph": "i", "name": "sync", "pid": 3, "tid": 4, "ts": 3.0},
    ]}))  # fmt: skip
    (trace,) = read_trace_file(other)
    assert [(r.name, r.kind) for r in trace.records] == [
        ("rollout", "range"), ("reward", "range"), ("sync", "instant"),
    ]  # fmt: skip
    assert trace.ranges[0].duration_ns == 3000


def test_a_tree_mixing_every_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    export_rank(tmp_path / "trainer", synthetic_rank(0))
    _trace_view(tmp_path / "npu", rank=1)
    _torch_profile(tmp_path / "kineto")
    (tmp_path / "kineto" / "ops_only.pt.trace.json").write_text(
        json.dumps(
            {
                "schemaVersion": 1,
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "aten::mm",
                        "pid": 1,
                        "tid": 1,
                        "ts": 1,
                        "dur": 1,
                    }
                ],
            }
        )
    )
    (tmp_path / "junk.trace.json").write_text("{")
    code = cli_main(["summary", str(tmp_path), "--json", "--jobs", "1"])
    out, err = capsys.readouterr()
    assert code == 1  # the junk file is an error, named, and the rest is summarised
    assert "junk.trace.json: is not valid JSON" in err
    assert "ops_only.pt.trace.json: is a torch.profiler trace with no user_annotation" in err
    assert err.count("error:") == 1  # a trace with nothing marked is a note, not an error
    doc = json.loads(out)
    assert set(doc["ranks"]) == {"0", "1"}  # the torch.profiler trace has no rank: rank 0
    names = {p["name"] for p in doc["phases"]}
    assert {"forward", "generate_sequences", "update_actor", "ProfilerStep"} <= names


def test_start_stop_marks_are_ranges_in_summary_and_timeline(tmp_path: Path) -> None:
    marks = [
        InstantRecord("weight_sync_start", "default", T0 + 10, TID, PID),
        InstantRecord("weight_sync_start", "default", T0 + 20, TID, PID),  # nested: LIFO
        InstantRecord("weight_sync_stop", "default", T0 + 30, TID, PID),
        InstantRecord("weight_sync_stop", "default", T0 + 50, TID, PID),
        InstantRecord("lonely_stop", "default", T0 + 60, TID, PID),
        InstantRecord("weight_sync_start", "default", T0 + 70, TID + 1, PID),  # other thread
        InstantRecord("weight_sync_stop", "default", T0 + 80, TID, PID),  # no start on TID
    ]
    trace = RankTrace(0, [rng("step", 0, 100), *marks])
    db = write_ascend_db(tmp_path / "db" / "ascend_pytorch_profiler_0.db", trace)
    write_chrome_trace(tmp_path / "chrome" / "r0.trace.json", [trace])
    for where in (db.parent, tmp_path / "chrome"):
        s = summarize_path(where, jobs=1)
        (sync,) = [p for p in s.phases if p.name == "weight_sync"]
        # Paired LIFO: 20-30 inside 10-50 (FIFO would give 10-30 and 20-50). The registry has
        # no phase weight_sync, so a range nested in another of that name is counted too.
        assert sync.overall.count == 2 and sync.overall.total_ns == 50
        assert sync.overall.max_ns == 40 and not [n for n in s.notes if "weight_sync (" in n]
    (read,) = read_trace_file(db)
    assert sorted(r.name for r in read.instants) == [
        "lonely_stop", "weight_sync_start", "weight_sync_stop",
    ]  # fmt: skip
    svg = render_svg([trace])
    assert svg.count('data-name="weight_sync" data-start-ns') == 2  # two bars


def test_step_key_groups_ranges_into_steps(tmp_path: Path) -> None:
    def rollout(start: int, end: int, rid: int) -> RangeRecord:
        return RangeRecord("rollout", "default", T0 + start, T0 + end, TID, PID, args={"rid": rid})

    trace = RankTrace(0, [rollout(0, 10, 1), rollout(5, 20, 1), rollout(30, 40, 2)])
    write_chrome_trace(tmp_path / "r.trace.json", [trace])
    s = summarize_path(tmp_path, StepOptions("rollout", "rid"), jobs=1)
    assert s.step_keys == {M(0): []} and s.step_time_ns == {M(0): 20 + 10}  # rid 1, 2: in order
    trace.records.append(rollout(50, 55, 9))
    write_chrome_trace(tmp_path / "r.trace.json", [trace])
    s = summarize_path(tmp_path, StepOptions("rollout", "rid"), jobs=1)
    assert s.step_keys == {M(0): ["1", "2", "9"]} and s.step_count == {M(0): 3}
    assert cli_main(["summary", str(tmp_path), "--step-name", "rollout", "--step-key", "rid"]) == 0


def _msprof_trace_view(folder: Path, rank: int = 0) -> Path:
    """torch_npu's trace_view.json holding MSTX events exactly as msprof's
    ``MsprofTxAssembler`` writes them (``analysis/csrc/application/timeline/
    msprof_tx_assembler.cpp`` and its unit test): ``X`` events with NO ``cat``, ``args`` holding
    ``event_type`` (and ``domain`` for mstx ones, else msproftx's Category/Payload fields), a
    flow start of category ``MsTx`` per mstx event, a process named from ``pid_name`` (here
    ``python_main``) and threads named ``Thread N``; beside them torch_npu's ProfilerStep#N."""
    out = folder / "host_1_20250101000000000_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out.parent / f"profiler_info_{rank}.json").write_text("{}")
    us = lambda ns: f"{(T0 + ns) // 1000}.{(T0 + ns) % 1000:03d}"  # noqa: E731
    tx = 223  # msprof's formatted pid of its MSTX process
    events = [
        {"ph": "X", "name": "ProfilerStep#3", "pid": PID, "tid": TID, "ts": us(0),
         "dur": 1000.0, "cat": "cpu_op", "args": {}},
        {"name": "generate_sequences", "pid": tx, "tid": TID, "ts": us(10_000), "dur": 500.0,
         "ph": "X", "args": {"event_type": "start/end", "domain": "default"}},
        {"name": "MsTx_4000000001", "pid": tx, "tid": TID, "ph": "s", "cat": "MsTx",
         "id": "4000000001", "ts": us(10_000)},
        {"name": "vllm_one_step", "pid": tx, "tid": TID, "ts": us(20_000), "dur": 100.0,
         "ph": "X", "args": {"event_type": "push/pop", "domain": "vllm"}},
        {"name": "MsTx_4000000002", "pid": tx, "tid": TID, "ph": "s", "cat": "MsTx",
         "id": "4000000002", "ts": us(20_000)},
        {"name": "weights_synced", "pid": tx, "tid": TID, "ts": us(600_000), "dur": 0,
         "ph": "X", "args": {"event_type": "marker", "domain": "verl"}},
        {"name": "tx", "pid": tx, "tid": TID, "ts": us(700_000), "dur": 200.0, "ph": "X",
         "args": {"Category": "23438457", "Payload_type": 0, "Payload_value": 283728437,
                  "Message_type": 1, "event_type": "start/end"}},
        {"name": "process_name", "pid": tx, "tid": 0, "ph": "M", "args": {"name": "python_main"}},
        {"name": "process_labels", "pid": tx, "tid": 0, "ph": "M", "args": {"labels": "CPU"}},
        {"name": "process_sort_index", "pid": tx, "tid": 0, "ph": "M", "args": {"sort_index": 6}},
        {"name": "thread_name", "pid": tx, "tid": TID, "ph": "M",
         "args": {"name": f"Thread {TID}"}},
        {"name": "thread_sort_index", "pid": tx, "tid": TID, "ph": "M",
         "args": {"sort_index": TID}},
    ]  # fmt: skip
    path = out / "trace_view.json"
    path.write_text(json.dumps(events))
    return path


def test_msprofs_mstx_events_without_a_category_are_read(tmp_path: Path) -> None:
    path = _msprof_trace_view(tmp_path, rank=2)
    (trace,) = read_trace_file(path)
    ranges = {r.name: r for r in trace.ranges}
    assert set(ranges) == {"ProfilerStep", "generate_sequences", "vllm_one_step", "tx"}
    assert ranges["generate_sequences"].duration_ns == 500_000
    assert ranges["vllm_one_step"].domain == "vllm"  # args.domain is the domain
    assert ranges["tx"].domain == "default"  # (msproftx's events name none)
    (mark,) = trace.instants  # a marker is an instant, not a range of no time
    assert (mark.name, mark.domain, mark.start_ns) == ("weights_synced", "verl", T0 + 600_000)
    summary = summarize_path(tmp_path, jobs=1)
    assert summary.errors == [] and summary.step_keys == {M(2): ["3"]}
    gen = next(p for p in summary.phases if p.name == "generate_sequences")
    assert gen.overall.count == 1 and gen.overall.total_ns == 500_000


def _msprof_db(path: Path, rank: int) -> Path:
    """msprof's database (ours in its layout, renamed as msprof names it: by time, not rank)."""
    staged = write_ascend_db(path.parent / "stage.db", synthetic_rank(rank))
    path.parent.mkdir(parents=True, exist_ok=True)
    staged.rename(path)
    return path


def test_the_folder_search_finds_msprof_databases_and_kineto_under_any_name(
    tmp_path: Path,
) -> None:
    prof = _msprof_db(tmp_path / "PROF_000001_x" / "mindstudio_profiler_output"
                      / "msprof_20250101120000.db", rank=3)  # fmt: skip
    bare = _msprof_db(tmp_path / "bare" / "msprof_20250101120001.db", rank=4)
    # Inside a torch_npu output folder, msprof's database is the torch_npu one's source: left out.
    npu = tmp_path / "host_2_20250101000000000_ascend_pt"
    export_db = write_ascend_db(
        npu / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_5.db", synthetic_rank(5)
    )
    _msprof_db(npu / "PROF_000002_y" / "msprof_20250101120002.db", rank=5)
    kineto = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#9", "pid": 1, "tid": 2,
         "ts": 1.0, "dur": 5.0},
    ], "baseTimeNanoseconds": T0}  # fmt: skip
    gz = tmp_path / "hta" / "mi250_minitoy_kineto.json.gz"
    gz.parent.mkdir()
    gz.write_bytes(gzip.compress(json.dumps(kineto).encode()))
    plain = tmp_path / "hta" / "profile.json"  # export_chrome_trace("profile.json")
    plain.write_text(json.dumps({**kineto, "distributedInfo": {"rank": 7}}))
    (tmp_path / "hta" / "config.json").write_text('{"traceEvents": []}')  # not Kineto's
    assert find_trace_files(tmp_path) == sorted([prof, bare, export_db, gz, plain])
    summary = summarize_path(tmp_path, jobs=1)
    assert summary.errors == []
    # msprof's file name is a time: the rank is RANK_DEVICE_MAP's.
    assert sorted(m.rank for m in summary.members()) == [0, 3, 4, 5, 7]
    assert summary.step_keys[M(7)] == ["9"]
