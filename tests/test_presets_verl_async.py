"""verl's asynchronous modes: the weight sync marked on each side, the overlapped rollout's timer
said for what it measures, and the ``verl-async`` coverage set.

The rows are checked against verl 0.9.1's own source (installed in the test environment with
``--no-deps``: read, not imported, since its checkpoint engine needs Ray), and run on stand-in
classes with the real methods' shapes (async, in a Ray actor's event loop). The real
one-step-off job runs in tests/test_real_async.py.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from support.stand_ins import fake_module

import mstx_marks
from mstx_marks.analysis.model.aggregate import aggregate_trace, combine
from mstx_marks.analysis.model.coverage import check_coverage, expected_phases
from mstx_marks.base.records import RangeRecord, RankTrace
from mstx_marks.capture import presets

#: The version strings of verl rows that apply to 0.9.1.
_APPLY_TO_0_9_1 = (
    "0.7.1 and newer", "0.8.0 and newer", "0.9.1 and newer", "0.7 and newer", "0.6 and newer"
)  # fmt: skip


def _verl_source() -> Path:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (the test extra installs verl 0.9.1 --no-deps)")
    root = Path(next(iter(spec.submodule_search_locations)))
    version = (root / "version" / "version").read_text().strip()
    if version != "0.9.1":
        pytest.skip(f"verl {version} installed; these rows are read against 0.9.1")
    return root


def _defines(tree: ast.Module, path: str) -> bool:
    """Whether the module's source defines ``path``: a global, or ``Class.method`` in the class
    body."""
    owner, _, attr = path.rpartition(".")
    for node in tree.body:
        if not owner:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if any((a.asname or a.name) == attr for a in node.names):
                    return True
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == attr:
                return True
        elif isinstance(node, ast.ClassDef) and node.name == owner:
            return any(
                isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == attr
                for f in node.body
            )
    return False


def test_every_verl_row_for_0_9_1_names_a_real_method_in_its_source() -> None:
    root = _verl_source()
    rows = [t for t in presets.TARGETS if t.framework == "verl" and t.versions in _APPLY_TO_0_9_1]
    missing = []
    for t in rows:
        file = root.joinpath(*t.module.split(".")[1:]).with_suffix(".py")
        if not file.is_file():
            if t.patch.__name__ != "route_timer":  # 0.8.0's main_ppo_sync: gone in 0.9
                missing.append(f"{t.module} (no file)")
            continue
        if not _defines(ast.parse(file.read_text()), t.path):
            missing.append(f"{t.module}:{t.path}")
    assert missing == []
    weight_sync = {t.phase for t in rows} & {
        "actor_send_weights", "rollout_receive_weights", "rollout_pause", "rollout_resume"
    }  # fmt: skip
    assert len(weight_sync) == 4


# --- the rows at work, on stand-ins with verl 0.9.1's shapes ----------------------------------


class _Log(mstx_marks.backends.Backend):
    """A backend that logs each range's start and end, by name."""

    name = "log"

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.names: dict[int, str] = {}

    def emitter(self, stream: object) -> mstx_marks.backends.Emitter:
        def start(name: str, domain: str) -> int:
            rid = len(self.names) + 1
            self.names[rid] = name
            self.log.append(("start", name))
            return rid

        def end(rid: int, domain: str) -> None:
            self.log.append(("end", self.names[rid]))

        return mstx_marks.backends.Emitter(self, start, end, lambda n, d: None)


def test_both_sides_of_a_weight_sync_and_the_pause_are_ranges_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done: list[str] = []

    class ActorRolloutRefWorker:  # verl/workers/engine_workers.py:728 (0.9.1)
        async def update_weights(self, global_steps: Any = None, mode: str = "auto") -> dict:
            await asyncio.sleep(0.01)
            done.append("sent")
            return {}

    class CheckpointEngineWorker:  # verl/checkpoint_engine/base.py:354
        async def update_weights(self, global_steps: Any = None) -> None:
            await asyncio.sleep(0.02)
            done.append("loaded")

    class vLLMHttpServer:  # verl/workers/rollout/vllm_rollout/vllm_async_server.py
        async def abort_all_requests(self, reset_prefix_cache: bool = True) -> dict:
            done.append("paused")
            return {"aborted_count": 0}

        async def resume_generation(self) -> None:
            done.append("resumed")

    fake_module(
        monkeypatch, "verl.workers.engine_workers", ActorRolloutRefWorker=ActorRolloutRefWorker
    )
    fake_module(
        monkeypatch, "verl.checkpoint_engine.base", CheckpointEngineWorker=CheckpointEngineWorker
    )
    fake_module(
        monkeypatch, "verl.workers.rollout.vllm_rollout.vllm_async_server",
        vLLMHttpServer=vLLMHttpServer,
    )  # fmt: skip
    backend = _Log()
    mstx_marks.configure(backend=backend)

    async def sync() -> None:  # CheckpointEngineManager.update_weights, in one process here
        server = vLLMHttpServer()
        await server.abort_all_requests()
        await asyncio.gather(
            ActorRolloutRefWorker().update_weights(3), CheckpointEngineWorker().update_weights(3)
        )
        await server.resume_generation()

    with presets.apply("verl"):
        asyncio.run(sync())
    assert done == ["paused", "sent", "loaded", "resumed"]
    assert backend.log == [
        ("start", "rollout_pause"), ("end", "rollout_pause"),
        ("start", "actor_send_weights"), ("start", "rollout_receive_weights"),
        ("end", "actor_send_weights"), ("end", "rollout_receive_weights"),
        ("start", "rollout_resume"), ("end", "rollout_resume"),
    ]  # fmt: skip


# --- the summary says which range measures the overlapped rollout -----------------------------


def _trace(role: str, pid: int, ranges: list[tuple[str, int, int]]) -> RankTrace:
    records = [
        RangeRecord(
            name=n, domain="default", start_ns=s * 10**6, end_ns=e * 10**6, thread=1, pid=pid
        )
        for n, s, e in ranges
    ]
    return RankTrace(rank=0, records=records, role=role)


def test_the_summary_says_generate_async_overstates_the_rollout_and_what_measures_it() -> None:
    trainer = _trace(
        "TaskRunner", 1,
        [("step", 0, 1000), ("gen", 0, 10), ("generate_async", 10, 900), ("update_actor", 500, 890),
         ("step", 1000, 2000), ("gen", 1000, 1010), ("generate_async", 1010, 1950)],
    )  # fmt: skip
    agent = _trace(
        "AgentLoopWorker", 2, [("generate_sequences", 12, 412), ("generate_sequences", 1012, 1400)]
    )
    summary = combine([aggregate_trace(trainer), aggregate_trace(agent)])
    names = {p.name for p in summary.phases if p.role == "TaskRunner"}
    assert "generate_async" in names and "generate_sequences" in names  # `gen` folds there
    [note] = [n for n in summary.notes if n.startswith("generate_async")]
    assert (
        "overstates" in note
        and "generate_sequences measures it in AgentLoopWorker rank 0 (" in note
    )
    assert "median 915.0 ms" in note  # (890 + 940) / 2
    assert "(median 394.0 ms)" in note  # (400 + 388) / 2


def test_the_verl_async_expectation_names_both_sides_of_the_weight_sync() -> None:
    expected = expected_phases("verl-async+vllm")
    for name in ("generate_async", "actor_send_weights", "rollout_receive_weights",
                 "rollout_pause", "rollout_resume", "update_weights", "vllm_one_step"):  # fmt: skip
        assert name in expected
    trace = _trace("TaskRunner", 1, [("step", 0, 10), ("sync_rollout_weights", 1, 2)])
    report = check_coverage([trace], expected_phases("verl-async"))
    assert "update_weights" not in report.missing  # the one-step-off timer's name folds there
    assert "actor_send_weights" in report.missing
