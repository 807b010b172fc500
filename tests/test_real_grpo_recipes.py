"""The seed guide's capture recipes on the real verl 0.9.1 GRPO job (tests/test_real_grpo.py's
marked run, shared: 2 steps, one mini-batch of one micro-batch per step), armed from the
environment alone (tests/support/grpo_runs.py's CAPTURE, beside the presets):

    MSTX_MARKS_CAPTURE="update_micro_batch:...;ref_log_prob_micro_batch:...;rollout_decode:..."

On this CPU machine a recipe's profiler is torch.profiler (the schedule, the windows and the
folders are those of torch_npu's on an NPU): each window writes one ``*.pt.trace.json`` into its
folder. What the guide's hand edits capture, this must capture:

- the update window holds the micro-batch's forward AND its backward (the guide steps at the
  end of the loop body, after backward);
- a window per PPO step (the guide builds a new profiler in every call of the loop function);
- the reference's log-prob window is the reference's (``Ref_compute_log_prob``), not the actor's;
- the rollout window comes from the vLLM engine's worker process (``vllm_profile``).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.grpo_job import Job

STEPS = 2


def _traces(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.name.endswith((".pt.trace.json", ".json.gz")))


def _events(trace: Path) -> list[dict[str, Any]]:
    opener: Any = gzip.open if trace.name.endswith(".gz") else open
    with opener(trace, "rt") as f:
        data = json.load(f)
    return [e for e in data.get("traceEvents", []) if isinstance(e, dict)]


def _pid_of(trace: Path) -> int:
    pids = {e.get("pid") for e in _events(trace) if e.get("ph") == "X"}
    ints = {p for p in pids if isinstance(p, int)}
    assert len(ints) == 1, (trace, pids)
    return ints.pop()


@pytest.fixture(scope="module")
def captured(grpo_marked: Job) -> tuple[Job, Path]:
    job = grpo_marked
    assert job.steps == [1, 2] and job.out is not None, job.log[-3000:]
    return job, job.out


def test_each_recipe_writes_the_guides_folder(captured: tuple[Job, Path]) -> None:
    _, out = captured
    folders = {p.name for p in out.iterdir() if p.is_dir() and _traces(p)}
    assert {"fsdp_actor_update_micro_batch", "Ref_compute_log_prob", "vllm_profile"} <= folders
    # the reference's window is the reference's: no actor log-prob folder from this recipe
    assert "Actor_compute_log_prob" not in folders


def test_a_window_per_ppo_step(captured: tuple[Job, Path]) -> None:
    _, out = captured
    for folder in ("fsdp_actor_update_micro_batch", "Ref_compute_log_prob"):
        assert len(_traces(out / folder)) == STEPS, folder


def test_the_update_window_holds_forward_and_backward(captured: tuple[Job, Path]) -> None:
    _, out = captured
    traces = _traces(out / "fsdp_actor_update_micro_batch")
    assert len(traces) == STEPS, traces  # a loop over no trace would assert nothing
    for trace in traces:
        names = [str(e.get("name", "")) for e in _events(trace)]
        assert any("Backward" in n or "backward" in n for n in names), trace
        assert any(n.startswith(("aten::linear", "aten::addmm", "aten::mm")) for n in names), trace


def test_the_reference_window_is_forward_only(captured: tuple[Job, Path]) -> None:
    _, out = captured
    traces = _traces(out / "Ref_compute_log_prob")
    assert len(traces) == STEPS, traces  # a loop over no trace would assert nothing
    for trace in traces:
        names = [str(e.get("name", "")) for e in _events(trace)]
        assert any(n.startswith(("aten::linear", "aten::addmm", "aten::mm")) for n in names), trace
        assert not any("Backward" in n for n in names), trace


def test_the_rollout_window_comes_from_the_engine_worker(captured: tuple[Job, Path]) -> None:
    job, out = captured
    (trace,) = _traces(out / "vllm_profile")  # once per engine process (the guide's __init__)
    pid = _pid_of(trace)
    # Log lines carry "(Name pid=N)" prefixes: Ray's for its actors, vLLM's for its processes.
    names = {name for name, found in re.findall(r"\(([\w-]+) pid=(\d+)\)", job.log)
             if int(found) == pid}  # fmt: skip
    assert names and names <= {"Worker", "VllmWorker-0", "Worker_TP0"}, names
    assert pid != job.result.get("driver_pid")
    names = [str(e.get("name", "")) for e in _events(trace)]
    assert any(n.startswith(("aten::linear", "aten::addmm", "aten::mm")) for n in names)
