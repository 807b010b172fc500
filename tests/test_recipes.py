"""Profiler recipes (mstx_marks.profiling.recipes): real torch.profiler traces over stand-in
framework classes, the post-import wait, ref/actor, MSTX_MARKS_CAPTURE parsing, and (when its venv
exists) the real verl.

The stand-ins are test-made classes registered in ``sys.modules`` under the real frameworks'
module names (``vllm.v1.worker.gpu_worker``, ``verl.workers.engine.fsdp.transformer_impl``,
``verl.workers.engine_workers``), with the methods the recipes patch.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mstx_marks
from mstx_marks import MstxMarksWarning
from mstx_marks.profiling import recipes, windows
from mstx_marks.profiling.recipes import captures, verl_calls

torch = pytest.importorskip("torch")

GPU_WORKER = "vllm.v1.worker.gpu_worker"
ASCEND_WORKER = "vllm_ascend.worker.worker"
FSDP = "verl.workers.engine.fsdp.transformer_impl"
MCORE = "verl.workers.engine.megatron.transformer_impl"
ENGINE_WORKERS = "verl.workers.engine_workers"
VERL_REGISTER_ATTR = "attrs_3141562937"  # where verl's @register keeps its dispatch settings


@pytest.fixture(autouse=True)
def disarm_all() -> Iterator[None]:
    """No capture outlives its test; every patched site is restored."""
    yield
    for handle in recipes.armed():
        handle.undo()
    for site, hook in verl_calls._stage_sites:
        windows.unhook(site, hook)
    verl_calls._stage_sites.clear()
    verl_calls._stage_hooks.clear()
    assert windows._sites == {}
    assert windows.running() is None


def our_warnings(got: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in got if issubclass(w.category, MstxMarksWarning)]


def stand_in(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> types.ModuleType:
    """A test-made module registered as ``name`` (a stand-in for the framework's module)."""
    module = types.ModuleType(name)
    for key, value in attrs.items():
        if isinstance(value, type):
            value.__module__ = name
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def traced_names(folder: Path) -> list[str]:
    """The record_function names in the one Chrome trace torch's trace handler wrote there."""
    files = sorted(folder.glob("*.pt.trace.json"))
    assert len(files) == 1, files
    events = json.loads(files[0].read_text())["traceEvents"]
    return sorted(
        e["name"]
        for e in events
        if e.get("cat") == "user_annotation" and not e["name"].startswith("ProfilerStep")
    )


# --- rollout_decode over a stand-in vLLM worker, real torch.profiler -----------------------------


def make_vllm_worker() -> type:
    class Worker:  # stand-in for vllm.v1.worker.gpu_worker.Worker
        def execute_model(self, i: int) -> int:
            with torch.profiler.record_function(f"call{i}"):
                if i == 2:
                    raise ValueError("call 2 broke")
                return i * 10

    return Worker


def test_rollout_decode_profiles_only_the_active_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MSTX_MARKS_ROLE", "rollout")
    Worker = make_vllm_worker()
    stand_in(monkeypatch, GPU_WORKER, Worker=Worker)
    original = vars(Worker)["execute_model"]

    handle = recipes.capture("rollout_decode", wait=1, warmup=1, active=2, out=str(tmp_path))
    assert Worker.execute_model is not original  # patched at once: the module is imported
    assert Worker.execute_model.__wrapped__ is original
    worker = Worker()
    assert worker.execute_model(0) == 0  # wait
    assert worker.execute_model(1) == 10  # warmup
    with pytest.raises(ValueError, match="call 2 broke"):  # active, raises: still a step
        worker.execute_model(2)
    assert handle.counted == 3 and not handle.done
    assert worker.execute_model(3) == 30  # active, last step: the profiler stops

    assert handle.done and handle.counted == 4
    assert vars(Worker)["execute_model"] is original
    assert worker.execute_model(4) == 40  # after the schedule: the original, unprofiled
    folder = tmp_path / "vllm_profile"
    assert handle.save_path == str(folder)
    assert traced_names(folder) == ["call2", "call3"]
    assert recipes.armed() == ()


def test_repeat_writes_one_trace_per_cycle_then_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MSTX_MARKS_ROLE", "rollout")
    Worker = make_vllm_worker()
    stand_in(monkeypatch, GPU_WORKER, Worker=Worker)
    handle = recipes.capture("rollout_decode", wait=1, active=1, repeat=2, out=str(tmp_path))
    assert [Worker().execute_model(i) for i in (0, 1, 3, 4)] == [0, 10, 30, 40]
    assert handle.done and vars(Worker)["execute_model"].__name__ == "execute_model"
    assert not hasattr(vars(Worker)["execute_model"], "__wrapped__")
    files = sorted((tmp_path / "vllm_profile").glob("*.pt.trace.json"))
    names = []
    for path in files:
        events = json.loads(path.read_text())["traceEvents"]
        names.append(sorted({e["name"] for e in events if str(e.get("name")).startswith("call")}))
    assert sorted(names) == [["call1"], ["call4"]]


def test_a_patched_subclass_calling_its_patched_base_is_one_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Worker = make_vllm_worker()

    class NPUWorker(Worker):  # type: ignore[misc,valid-type]  # stand-in for vllm-ascend's
        def execute_model(self, i: int) -> int:
            return super().execute_model(i) + 1

    stand_in(monkeypatch, GPU_WORKER, Worker=Worker)
    stand_in(monkeypatch, ASCEND_WORKER, NPUWorker=NPUWorker)
    handle = recipes.capture("rollout_decode", active=3, out=str(tmp_path))
    worker = NPUWorker()
    assert [worker.execute_model(i) for i in (0, 1)] == [1, 11]
    assert handle.counted == 2
    assert worker.execute_model(3) == 31
    assert handle.done
    assert "execute_model" in vars(NPUWorker) and not hasattr(
        vars(NPUWorker)["execute_model"], "__wrapped__"
    )


def test_the_recipe_waits_for_the_module_to_be_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("a real vllm is installed; this test writes its own vllm package")
    root = tmp_path / "src"
    package = root / "vllm" / "v1" / "worker"
    package.mkdir(parents=True)
    for folder in (root / "vllm", root / "vllm" / "v1", package):
        (folder / "__init__.py").write_text("")
    source = package / "gpu_worker.py"
    source.write_text(
        textwrap.dedent(
            """
            class Worker:  # stand-in for vLLM's gpu_worker.Worker
                def execute_model(self, x):
                    return x + 1
            """
        )
    )
    monkeypatch.syspath_prepend(str(root))
    for name in ("vllm", "vllm.v1", "vllm.v1.worker", GPU_WORKER):
        monkeypatch.delitem(sys.modules, name, raising=False)

    handle = recipes.capture("rollout_decode", active=1, out=str(tmp_path / "out"))
    assert GPU_WORKER not in sys.modules  # arming imported nothing
    try:
        module = importlib.import_module(GPU_WORKER)
        patched = vars(module.Worker)["execute_model"]
        assert patched.__wrapped__.__code__.co_filename == str(source)
        assert module.Worker().execute_model(1) == 2  # the one active step
        assert handle.done
        assert vars(module.Worker)["execute_model"] is patched.__wrapped__
        assert list((tmp_path / "out").glob("vllm_profile/*.pt.trace.json"))
    finally:
        for name in ("vllm", "vllm.v1", "vllm.v1.worker", GPU_WORKER):
            sys.modules.pop(name, None)


def test_undo_before_the_import_patches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, GPU_WORKER, raising=False)
    handle = recipes.capture("rollout_decode", out=str(tmp_path))
    handle.undo()
    Worker = make_vllm_worker()
    original = vars(Worker)["execute_model"]
    module = types.ModuleType(GPU_WORKER)
    module.Worker = Worker  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, GPU_WORKER, module)
    handle._attach(recipes.RECIPES[0].targets[0], module)  # the hook, run late
    assert vars(Worker)["execute_model"] is original


def window_names(folder: Path) -> list[list[str]]:
    """Per trace file (one per window, oldest first), the record_function names in it."""
    out = []
    for path in sorted(folder.glob("*.pt.trace.json"), key=lambda p: p.stat().st_mtime_ns):
        events = json.loads(path.read_text())["traceEvents"]
        out.append(
            sorted(
                e["name"]
                for e in events
                if e.get("cat") == "user_annotation" and not e["name"].startswith("ProfilerStep")
            )
        )
    return out


# --- verl 0.9.1's engines and workers, stand-ins with the real loop shapes ----------------------


def make_fsdp_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    class FSDPEngine:  # verl 0.9.1 transformer_impl.py ~724-776: backward AFTER forward_step
        def __init__(self, name: str, forward_only_config: bool, value: bool = False) -> None:
            self.name = name
            self.engine_config = types.SimpleNamespace(forward_only=forward_only_config)
            self.optimizer = None if forward_only_config else object()
            self.model_config = types.SimpleNamespace(
                model_type="value_model" if value else "language_model"
            )

        def forward_backward_batch(self, n: int, loss_function: Any = None,
                                   forward_only: bool = False) -> list[str]:  # fmt: skip
            out = []
            for i in range(n):
                out.append(self.forward_step(i, loss_function=None, forward_only=forward_only))
                if not forward_only:
                    with torch.profiler.record_function(f"{self.name}_backward_mb{i}"):
                        pass
            return out

    class FSDPEngineWithLMHead(FSDPEngine):
        def forward_step(self, micro_batch: int, loss_function: Any, forward_only: bool) -> str:
            kind = "logprob" if forward_only else "train"
            label = f"{self.name}_{kind}_mb{micro_batch}"
            with torch.profiler.record_function(label):
                return label

    return stand_in(
        monkeypatch, FSDP, FSDPEngine=FSDPEngine, FSDPEngineWithLMHead=FSDPEngineWithLMHead
    )


class FakeDistProfiler:
    """verl's DistProfiler as the recipes see it: check_enable()."""

    def __init__(self, enabled: object) -> None:
        self.enabled = enabled

    def check_enable(self) -> bool:
        if isinstance(self.enabled, Exception):
            raise self.enabled
        return bool(self.enabled)


def make_training_worker(monkeypatch: pytest.MonkeyPatch) -> type:
    """engine_workers.TrainingWorker: train_mini_batch loops train_batch per mini-batch, each
    one forward_backward_batch of the engine; infer_batch one forward-only call."""

    def train_batch(self: Any, data: int) -> int:
        with torch.profiler.record_function(f"{self.name}_mini_batch{data}"):
            if self.engine is not None:
                self.engine.forward_backward_batch(2, None, forward_only=False)
            return data * 2

    setattr(train_batch, VERL_REGISTER_ATTR, {"dispatch_mode": "nd", "blocking": False})

    class TrainingWorker:  # stand-in for verl.workers.engine_workers.TrainingWorker
        def __init__(self, profiler: Any = None, engine: Any = None, name: str = "actor",
                     value: bool = False) -> None:  # fmt: skip
            self.name, self.engine = name, engine
            self.config = types.SimpleNamespace(
                model_type="value_model" if value else "language_model"
            )
            if profiler is not None:
                self.profiler = profiler

        def train_mini_batch(self, n: int) -> list[int]:
            return [self.train_batch(i) for i in range(n)]

        def infer_batch(self, n: int) -> list[str]:
            return self.engine.forward_backward_batch(n, None, forward_only=True)  # type: ignore[no-any-return]

    TrainingWorker.train_batch = train_batch  # type: ignore[attr-defined]
    stand_in(monkeypatch, ENGINE_WORKERS, TrainingWorker=TrainingWorker)
    return TrainingWorker


def test_a_micro_batch_window_holds_its_forward_and_its_backward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsdp = make_fsdp_module(monkeypatch)
    cap = recipes.capture("update_micro_batch", wait=1, active=1, out=str(tmp_path))
    engine = fsdp.FSDPEngineWithLMHead("actor", forward_only_config=False)
    engine.forward_backward_batch(3, forward_only=True)  # forward-only: not an update
    assert cap.windows == 0
    engine.forward_backward_batch(3, forward_only=False)
    engine.forward_backward_batch(3, forward_only=False)  # a new window in every call
    assert cap.windows == 2 and not cap.done
    folder = tmp_path / "fsdp_actor_update_micro_batch"
    assert cap.folders == [str(folder)] * 2 and cap.role == "actor"
    assert window_names(folder) == [["actor_backward_mb1", "actor_train_mb1"]] * 2


def test_ref_and_actor_log_prob_micro_batches_are_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsdp = make_fsdp_module(monkeypatch)
    ref_cap = recipes.capture("ref_log_prob_micro_batch", active=2, out=str(tmp_path))
    actor_cap = recipes.capture("actor_log_prob_micro_batch", active=2, out=str(tmp_path))
    ref = fsdp.FSDPEngineWithLMHead("ref", forward_only_config=True)
    actor = fsdp.FSDPEngineWithLMHead("actor", forward_only_config=False)
    actor.forward_backward_batch(2, forward_only=False)  # training: neither
    assert (ref_cap.windows, actor_cap.windows) == (0, 0)
    assert ref.forward_backward_batch(2, forward_only=True) == [
        "ref_logprob_mb0",
        "ref_logprob_mb1",
    ]
    actor.forward_backward_batch(3, forward_only=True)
    assert (ref_cap.counted, actor_cap.counted) == (2, 2)
    assert (ref_cap.role, actor_cap.role) == ("ref", "actor")
    assert window_names(tmp_path / "Ref_compute_log_prob") == [
        ["ref_logprob_mb0", "ref_logprob_mb1"]
    ]
    assert window_names(tmp_path / "Actor_compute_log_prob") == [
        ["actor_logprob_mb0", "actor_logprob_mb1"]
    ]


def test_the_ref_test_of_verl_0_9_1() -> None:
    assert verl_calls._is_ref(types.SimpleNamespace(optimizer=None))
    assert not verl_calls._is_ref(types.SimpleNamespace(optimizer=object()))
    assert verl_calls._is_ref(types.SimpleNamespace(actor_optimizer=None))  # legacy dp_actor
    # 0.9.1: the ref's optimizer config is a non-empty OptimizerConfig; the flag decides.
    flag_wins = types.SimpleNamespace(
        engine_config=types.SimpleNamespace(forward_only=False), optimizer=None,
        optimizer_config={"lr": 1e-6},
    )  # fmt: skip
    assert not verl_calls._is_ref(flag_wins)
    ref = types.SimpleNamespace(
        engine_config=types.SimpleNamespace(forward_only=True), optimizer_config={"lr": 1e-6}
    )
    assert verl_calls.verl_role(ref) == "ref"


def test_every_ppo_step_gets_its_window_and_steps_choose_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    TrainingWorker = make_training_worker(monkeypatch)
    cap = recipes.capture("update_mini_batch", wait=1, active=1, out=str(tmp_path))
    worker = TrainingWorker()
    for _ in range(2):  # 2 PPO steps x 3 mini-batches: the 2nd mini-batch of each
        assert worker.train_mini_batch(3) == [0, 2, 4]
    folder = tmp_path / "fsdp_actor_update_profile"
    assert window_names(folder) == [["actor_mini_batch1"]] * 2
    cap.undo()
    chosen = recipes.capture("update_mini_batch", active=1, steps=[2], out=str(tmp_path / "s"))
    worker = TrainingWorker()
    worker.train_mini_batch(2)
    assert chosen.windows == 0
    worker.train_mini_batch(2)
    assert chosen.windows == 1 and not chosen.done
    worker.train_mini_batch(2)  # step 3: every chosen step is behind, the methods restored
    assert chosen.done
    assert window_names(tmp_path / "s" / "fsdp_actor_update_profile") == [["actor_mini_batch0"]]


def test_actor_and_critic_in_one_process_each_get_their_folder_or_the_chosen_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    TrainingWorker = make_training_worker(monkeypatch)
    fsdp = make_fsdp_module(monkeypatch)
    critic = TrainingWorker(engine=fsdp.FSDPEngineWithLMHead("critic", False, value=True),
                            name="critic", value=True)  # fmt: skip
    actor = TrainingWorker(engine=fsdp.FSDPEngineWithLMHead("actor", False), name="actor")
    with recipes.capture("update_micro_batch", active=1, out=str(tmp_path / "both")):
        critic.train_mini_batch(1)  # the critic's update runs first in a PPO step
        actor.train_mini_batch(1)
    assert window_names(tmp_path / "both" / "fsdp_critic_update_micro_batch") == [
        ["critic_backward_mb0", "critic_train_mb0"]
    ]
    assert window_names(tmp_path / "both" / "fsdp_actor_update_micro_batch") == [
        ["actor_backward_mb0", "actor_train_mb0"]
    ]
    with recipes.capture("update_mini_batch", role="actor", out=str(tmp_path / "one")) as cap:
        critic.train_mini_batch(1)
        actor.train_mini_batch(1)
        assert cap.folders == [str(tmp_path / "one" / "fsdp_actor_update_profile")]


def test_the_verl_profiler_warning_checks_the_worker_that_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warned: Any
) -> None:
    TrainingWorker = make_training_worker(monkeypatch)
    fsdp = make_fsdp_module(monkeypatch)
    engine = fsdp.FSDPEngineWithLMHead("actor", forward_only_config=False)
    worker = TrainingWorker(FakeDistProfiler(True), engine=engine)
    recipes.capture("update_micro_batch", active=1, out=str(tmp_path))
    with warned() as got:
        worker.train_mini_batch(1)  # the engine has no profiler: its worker does
    assert our_warnings(got) == [f"mstx_marks: {verl_calls.VERL_WARNING}"]
    assert "global_profiler.steps=null" in verl_calls.VERL_WARNING


def test_update_mini_batch_keeps_verls_register_attribute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    TrainingWorker = make_training_worker(monkeypatch)
    recipes.capture("update_mini_batch", warmup=1, active=2, out=str(tmp_path))
    wrapped = vars(TrainingWorker)["train_batch"]
    assert getattr(wrapped, VERL_REGISTER_ATTR) == {"dispatch_mode": "nd", "blocking": False}
    assert TrainingWorker().train_mini_batch(4) == [0, 2, 4, 6]
    assert window_names(tmp_path / "fsdp_actor_update_profile") == [
        ["actor_mini_batch1", "actor_mini_batch2"]
    ]


@pytest.mark.parametrize("profiler", [None, FakeDistProfiler(False), FakeDistProfiler(OSError())])
def test_no_verl_profiler_warning_when_it_is_off_or_the_probe_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warned: Any, profiler: Any
) -> None:
    TrainingWorker = make_training_worker(monkeypatch)
    cap = recipes.capture("update_mini_batch", active=1, out=str(tmp_path))
    with warned() as got:
        assert TrainingWorker(profiler).train_mini_batch(1) == [0]
    assert our_warnings(got) == []
    assert cap.windows == 1


def test_one_profiler_at_a_time_the_second_recipe_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    TrainingWorker = make_training_worker(monkeypatch)
    fsdp = make_fsdp_module(monkeypatch)
    mini = recipes.capture("update_mini_batch", active=1, out=str(tmp_path))
    micro = recipes.capture("update_micro_batch", active=1, out=str(tmp_path))
    worker = TrainingWorker(engine=fsdp.FSDPEngineWithLMHead("actor", False))
    worker.train_mini_batch(2)  # mini-batch 0: update_mini_batch's window runs
    assert (mini.windows, micro.windows) == (1, 1)  # micro's: mini-batch 1, after it
    assert window_names(tmp_path / "fsdp_actor_update_micro_batch") == [
        ["actor_backward_mb0", "actor_train_mb0"]
    ]


# --- the Megatron engine and the legacy workers ---------------------------------------------------


def make_megatron_module(monkeypatch: pytest.MonkeyPatch, pipeline: int = 1) -> types.ModuleType:
    class MegatronEngine:  # 0.9.1: forward_backward_func(forward_step_func=partial(...)) per call
        def __init__(self, name: str, forward_only_config: bool) -> None:
            self.name = name
            self.engine_config = types.SimpleNamespace(
                forward_only=forward_only_config, pipeline_model_parallel_size=pipeline
            )

        def forward_backward_batch(self, n: int, loss_function: Any = None,
                                   forward_only: bool = False) -> list[str]:  # fmt: skip
            step = functools.partial(self.forward_step, model=None)
            out = []  # megatron-core's forward_backward_no_pipelining: forward k, backward k
            for i in range(n):
                out.append(step(iter([i])))
                if not forward_only:
                    with torch.profiler.record_function(f"{self.name}_backward_mb{i}"):
                        pass
            return out

    class MegatronEngineWithLMHead(MegatronEngine):
        def forward_step(self, batch_iter: Any, model: Any) -> str:
            label = f"{self.name}_mcore_mb{next(batch_iter)}"
            with torch.profiler.record_function(label):
                return label

    class MegatronEngineWithValueHead(MegatronEngineWithLMHead):
        def forward_step(self, batch_iter: Any, model: Any) -> str:
            return super().forward_step(batch_iter, model)

    return stand_in(monkeypatch, MCORE, MegatronEngine=MegatronEngine,
                    MegatronEngineWithLMHead=MegatronEngineWithLMHead,
                    MegatronEngineWithValueHead=MegatronEngineWithValueHead)  # fmt: skip


def test_megatron_engine_log_prob_and_update_micro_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mcore = make_megatron_module(monkeypatch)
    recipes.capture("ref_log_prob_micro_batch", active=2, out=str(tmp_path))
    recipes.capture("update_micro_batch", wait=1, active=1, out=str(tmp_path))
    mcore.MegatronEngineWithLMHead("ref", forward_only_config=True).forward_backward_batch(
        2, forward_only=True
    )
    mcore.MegatronEngineWithValueHead("critic", False).forward_backward_batch(3)
    assert window_names(tmp_path / "Ref_compute_log_prob") == [["ref_mcore_mb0", "ref_mcore_mb1"]]
    assert window_names(tmp_path / "megatron_critic_update_micro_batch") == [
        ["critic_backward_mb1", "critic_mcore_mb1"]
    ]


def test_megatron_pipeline_parallel_refuses_micro_batches_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warned: Any
) -> None:
    mcore = make_megatron_module(monkeypatch, pipeline=2)
    cap = recipes.capture("update_micro_batch", active=1, out=str(tmp_path))
    with warned() as got:
        mcore.MegatronEngineWithLMHead("actor", False).forward_backward_batch(2)
    assert cap.windows == 0
    assert any("pipeline parallel" in m and "update_mini_batch" in m for m in our_warnings(got))


def make_legacy_dp_actor(monkeypatch: pytest.MonkeyPatch) -> type:
    class DataParallelPPOActor:  # verl 0.7.1 dp_actor.py: update_policy's two loops
        def __init__(self, actor_optimizer: Any = None) -> None:
            self.actor_optimizer = actor_optimizer

        def _forward_micro_batch(self, i: int) -> int:
            with torch.profiler.record_function(f"forward{i}"):
                return i

        def _optimizer_step(self) -> None:
            with torch.profiler.record_function("optimizer_step"):
                pass

        def compute_log_prob(self, n: int) -> list[int]:
            return [self._forward_micro_batch(i) for i in range(n)]

        def update_policy(self, minis: int, micros: int) -> None:
            for m in range(minis):
                for i in range(micros):
                    self._forward_micro_batch(m * micros + i)
                    with torch.profiler.record_function(f"backward{m * micros + i}"):
                        pass
                self._optimizer_step()

    stand_in(monkeypatch, "verl.workers.actor.dp_actor", DataParallelPPOActor=DataParallelPPOActor)
    return DataParallelPPOActor


def test_legacy_dp_actor_mini_micro_and_log_prob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Actor = make_legacy_dp_actor(monkeypatch)
    recipes.capture("update_mini_batch", wait=1, active=1, out=str(tmp_path / "mini"))
    actor = Actor(actor_optimizer=object())
    actor.update_policy(2, 2)
    assert window_names(tmp_path / "mini" / "fsdp_actor_update_profile") == [
        ["backward2", "backward3", "forward2", "forward3", "optimizer_step"]
    ]
    for handle in recipes.armed():
        handle.undo()
    recipes.capture("update_micro_batch", wait=1, active=1, out=str(tmp_path / "micro"))
    recipes.capture("ref_log_prob_micro_batch", active=1, out=str(tmp_path / "micro"))
    actor.update_policy(1, 2)
    Actor(actor_optimizer=None).compute_log_prob(2)  # the legacy ref: no optimizer
    assert window_names(tmp_path / "micro" / "fsdp_actor_update_micro_batch") == [
        ["backward1", "forward1", "optimizer_step"]
    ]
    assert window_names(tmp_path / "micro" / "Ref_compute_log_prob") == [["forward0"]]


def test_legacy_megatron_actor_says_micro_batches_cannot_be_captured(
    monkeypatch: pytest.MonkeyPatch, warned: Any
) -> None:
    class MegatronPPOActor:  # verl 0.7.1: micro-batches in megatron-core, through a closure
        def update_policy(self) -> None: ...

        def forward_backward_batch(self) -> None: ...

    stand_in(monkeypatch, "verl.workers.actor.megatron_actor", MegatronPPOActor=MegatronPPOActor)
    with warned() as got:
        recipes.capture("update_micro_batch")
        recipes.capture("update_mini_batch")
    messages = our_warnings(got)
    assert len(messages) == 1, messages
    assert "update_micro_batch" in messages[0] and "legacy Megatron actor" in messages[0]
    assert "use update_mini_batch" in messages[0] and "verl " in messages[0]


def test_vllm_offline_loop_a_window_per_generate_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class LLMEngine:
        def __init__(self) -> None:
            self.left = 0

        def step(self) -> int:
            self.left -= 1
            with torch.profiler.record_function(f"engine_step{self.left}"):
                return self.left

    class LLM:  # vllm.entrypoints.llm.LLM._run_engine: while has_unfinished: step()
        def __init__(self) -> None:
            self.llm_engine = LLMEngine()

        def _run_engine(self, n: int) -> None:
            self.llm_engine.left = n
            while self.llm_engine.left:
                self.llm_engine.step()

    stand_in(monkeypatch, "vllm.v1.engine.llm_engine", LLMEngine=LLMEngine)
    stand_in(monkeypatch, "vllm.entrypoints.llm", LLM=LLM)
    recipes.capture("vllm_offline_step", wait=1, active=1, out=str(tmp_path))
    llm = LLM()
    llm._run_engine(3)
    llm._run_engine(3)
    assert window_names(tmp_path / "vllm_offline_profile") == [["engine_step1"]] * 2


# --- the workload never breaks ---------------------------------------------------------------


def test_a_profiler_that_fails_to_build_warns_once_and_disarms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warned: Any
) -> None:
    def broken(**kwargs: Any) -> Any:
        raise RuntimeError("no profiler here")

    monkeypatch.setattr(mstx_marks.profiling.profiler, "build_profiler", broken)
    Worker = make_vllm_worker()
    stand_in(monkeypatch, GPU_WORKER, Worker=Worker)
    original = vars(Worker)["execute_model"]
    cap = recipes.capture("rollout_decode", active=3, out=str(tmp_path))
    with warned() as got:
        assert [Worker().execute_model(i) for i in (0, 1)] == [0, 10]
    messages = our_warnings(got)
    assert len(messages) == 1
    assert "rollout_decode" in messages[0] and "no profiler here" in messages[0]
    assert cap.done and cap.counted == 0
    assert vars(Worker)["execute_model"] is original


class StepFails:
    """A profiler whose step() raises on the second call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self) -> None:
        self.calls.append("start")

    def step(self) -> None:
        self.calls.append("step")
        if self.calls.count("step") == 2:
            raise RuntimeError("step broke")

    def stop(self) -> None:
        self.calls.append("stop")


def test_a_profiler_that_fails_to_step_is_stopped_and_the_call_still_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warned: Any
) -> None:
    fake = StepFails()
    monkeypatch.setattr(mstx_marks.profiling.profiler, "build_profiler", lambda **kw: fake)
    Worker = make_vllm_worker()
    stand_in(monkeypatch, GPU_WORKER, Worker=Worker)
    original = vars(Worker)["execute_model"]
    cap = recipes.capture("rollout_decode", active=5, out=str(tmp_path))
    with warned() as got:
        assert [Worker().execute_model(i) for i in (0, 1, 3)] == [0, 10, 30]
    assert len(our_warnings(got)) == 1 and "step broke" in our_warnings(got)[0]
    assert fake.calls == ["start", "step", "step", "stop"]
    assert cap.done and vars(Worker)["execute_model"] is original


def test_the_profiler_gets_the_recipe_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, Any] = {}

    def record(**kwargs: Any) -> Any:
        seen.update(kwargs)
        return StepFails()

    monkeypatch.setattr(mstx_marks.profiling.profiler, "build_profiler", record)
    stand_in(monkeypatch, GPU_WORKER, Worker=make_vllm_worker())
    recipes.arm_from_text(
        f"rollout_decode:wait=29,warmup=1,active=30,repeat=2,skip_first=3,level=Level2,"
        f"export=text,record_shapes=true,module=on,profile_memory=1,with_stack=yes,"
        f"analyse=false,out={tmp_path}"
    )
    cap = recipes.armed()[0]
    sys.modules[GPU_WORKER].Worker().execute_model(0)
    folder = str(tmp_path / "vllm_profile")
    assert seen == {
        "contents": ("npu", "cpu", "shapes", "module", "memory", "stack"),
        "level": "level2",
        "analysis": False,
        "export": "text",
        "save_path": folder,
        "wait": 29,
        "warmup": 1,
        "active": 30,
        "repeat": 2,
        "skip_first": 3,
    }
    assert cap.total == 123
    err = capsys.readouterr().err
    assert f"analyse(profiler_path='{folder}')" in err and "unparsed" in err


# --- capture(): arguments, out folder ------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"recipe": "decode"}, ValueError, "unknown recipe 'decode'"),
        ({"recipe": 3}, TypeError, "recipe must be a str, got int 3"),
        ({"wait": -1}, ValueError, "wait must be >= 0, got -1"),
        ({"warmup": 1.5}, TypeError, "warmup must be an int, got float 1.5"),
        ({"active": 0}, ValueError, "active must be >= 1, got 0"),
        ({"active": True}, TypeError, "active must be an int, got bool True"),
        ({"repeat": 0}, ValueError, "repeat must be >= 1, got 0"),
        ({"level": "level9"}, ValueError, "level 'level9' must be one of level_none"),
        ({"level": 1}, TypeError, "level must be a str, got int 1"),
        ({"export": "csv"}, ValueError, "export 'csv' must be 'db', 'text' or both"),
        ({"out": ""}, ValueError, "out must be a non-empty folder name, got ''"),
        ({"out": 3}, TypeError, "out must be a str or a path, got int 3"),
        ({"steps": [2]}, ValueError, "steps applies to the verl recipes only"),
        ({"role": "actor"}, ValueError, "role 'actor' for rollout_decode must be one of none"),
        ({"recipe": "update_mini_batch", "role": "ref"}, ValueError, "one of actor, critic"),
        ({"recipe": "update_mini_batch", "steps": [0]}, ValueError, "steps entry must be >= 1"),
        ({"record_shapes": 1}, TypeError, "record_shapes must be True or False"),
        ({"skip_first": -1}, ValueError, "skip_first must be >= 0"),
    ],
)
def test_capture_checks_its_arguments(kwargs: dict[str, Any], error: type, text: str) -> None:
    kwargs = {"recipe": "rollout_decode", **kwargs}
    with pytest.raises(error, match=text.replace("(", r"\(")):
        recipes.capture(kwargs.pop("recipe"), **kwargs)
    assert recipes.armed() == ()


def test_a_recipe_is_armed_once_at_a_time() -> None:
    first = recipes.capture("update_mini_batch")
    with pytest.raises(ValueError, match="already armed"):
        recipes.capture("update_mini_batch")
    first.undo()
    with recipes.capture("update_mini_batch") as again:
        assert recipes.armed() == (again,)
    assert again.done and recipes.armed() == ()


def test_out_defaults_to_mstx_marks_out_then_a_local_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with recipes.capture("rollout_decode") as cap:
        assert cap.out == str(tmp_path / "outputs")
    monkeypatch.setenv("MSTX_MARKS_OUT", "runs/out")
    with recipes.capture("rollout_decode") as cap:
        assert cap.out == str(tmp_path / "runs" / "out")
    with recipes.capture("rollout_decode", out=tmp_path / "given") as cap:
        assert cap.out == str(tmp_path / "given")


# --- MSTX_MARKS_CAPTURE ----------------------------------------------------------------------


def test_arm_from_text_arms_each_entry(tmp_path: Path, warned: Any) -> None:
    text = (
        f" rollout_decode:wait=29,warmup=1,active=30,repeat=2,level=level0,export=text,"
        f"out={tmp_path} ; update_mini_batch:active=3;;ref_log_prob_micro_batch"
    )
    with warned() as got:
        recipes.arm_from_text(text)
    assert our_warnings(got) == []
    rows = [(c.recipe.name, c.wait, c.warmup, c.active, c.repeat) for c in recipes.armed()]
    assert rows == [
        ("rollout_decode", 29, 1, 30, 2),
        ("update_mini_batch", 0, 0, 3, 1),
        ("ref_log_prob_micro_batch", 0, 0, 1, 1),
    ]
    decode = recipes.armed()[0]
    assert (decode.level, decode.export, decode.out) == ("level0", "text", str(tmp_path))


@pytest.mark.parametrize(
    ("entry", "rule"),
    [
        ("rollout_decode:wait=x", "wait='x' must be an int"),
        ("nope:active=1", "unknown recipe 'nope'"),
        ("rollout_decode:active=0", "active must be >= 1, got 0"),
        ("rollout_decode:wait=-2", "wait must be >= 0, got -2"),
        ("rollout_decode:speed=1", "unknown key 'speed'"),
        ("rollout_decode:wait=1,wait=2", "wait is given twice"),
        ("rollout_decode:level=level9", "level 'level9' must be one of"),
        ("rollout_decode:export=csv", "export 'csv' must be"),
        ("rollout_decode:active", "'active' is not key=value"),
        (":active=1", "expected RECIPE:key=value"),
        ("update_mini_batch:steps=[a]", "must be a list of ints"),
        ("rollout_decode:analyse=maybe", "must be true or false"),
    ],
)
def test_bad_capture_text_warns_once_and_arms_nothing(entry: str, rule: str, warned: Any) -> None:
    with warned() as got:
        recipes.arm_from_text(entry)
        recipes.arm_from_text(entry)  # the same mistake again: said once
    messages = our_warnings(got)
    assert len(messages) == 1, messages
    assert "MSTX_MARKS_CAPTURE" in messages[0] and repr(entry) in messages[0]
    assert rule in messages[0]
    assert recipes.armed() == ()


def test_one_bad_entry_leaves_the_others_armed(warned: Any) -> None:
    with warned() as got:
        recipes.arm_from_text("rollout_decode:active=x;update_mini_batch:active=2")
    assert len(our_warnings(got)) == 1
    assert [c.recipe.name for c in recipes.armed()] == ["update_mini_batch"]


def test_activation_from_the_environment_arms_the_recipes(monkeypatch: pytest.MonkeyPatch) -> None:
    from mstx_marks.launch import activate

    monkeypatch.setattr(activate, "_done_in", None)
    monkeypatch.setenv("MSTX_MARKS_CAPTURE", "update_micro_batch:wait=2,active=4")
    activate.activate()
    assert [(c.recipe.name, c.total) for c in recipes.armed()] == [("update_micro_batch", 6)]


# --- the table -------------------------------------------------------------------------------


def test_recipes_table_lists_every_recipe_target_folder_and_hand_edit() -> None:
    table = recipes.recipes_table()
    assert [r.name for r in recipes.RECIPES] == [
        "rollout_decode",
        "vllm_offline_step",
        "ref_log_prob_micro_batch",
        "actor_log_prob_micro_batch",
        "update_mini_batch",
        "update_micro_batch",
    ]
    for r in recipes.RECIPES:
        assert r.targets and r.step and r.replaces and r.frameworks
        assert "\n" not in r.replaces
        for text in (r.name, r.step, r.replaces, r.frameworks):
            assert text in table
        for target in r.targets:
            assert f"{target.module}:{target.path}" in table
    for folder in (
        "<out>/sglang_profile or vllm_profile",
        "<out>/vllm_offline_profile",
        "<out>/Ref_compute_log_prob",
        "<out>/Actor_compute_log_prob",
        "<out>/{fsdp,megatron}_{actor,critic}_update_profile",
        "<out>/{fsdp,megatron}_{actor,critic}_update_micro_batch",
    ):
        assert folder in table
    for key in ("skip_first", "steps", "role", "record_shapes", "with_modules", "analyse"):
        assert key in table
    assert max(len(line) for line in table.splitlines()) < 300


# --- the real verl 0.9.1, in its venv ------------------------------------------------------

REAL_VERL_SCRIPT = r"""
import json, os, sys
from mstx_marks.profiling import recipes, windows

out = sys.argv[1]
result = {}
mini = recipes.capture("update_mini_batch", active=1, out=out)
micro = recipes.capture("update_micro_batch", active=1, out=out)
assert "verl.workers.engine_workers" not in sys.modules
import verl.workers.engine_workers as w

def ours(owner, attr):
    return vars(owner)[attr].__code__.co_filename == windows.__file__

originals = {a: vars(w.TrainingWorker)[a].__wrapped__ for a in ("train_mini_batch", "train_batch")}
result["worker_ours"] = all(ours(w.TrainingWorker, a) for a in originals)
wrapped = vars(w.TrainingWorker)["train_batch"]
result["register_attr"] = getattr(wrapped, "attrs_3141562937", None) is getattr(
    wrapped.__wrapped__, "attrs_3141562937", 0
)
try:
    import verl.workers.engine.fsdp.transformer_impl as t
except ImportError as exc:
    result["fsdp_error"] = f"{type(exc).__name__}: {exc}"
else:
    result["fsdp_ours"] = ours(t.FSDPEngine, "forward_backward_batch") and ours(
        t.FSDPEngineWithLMHead, "forward_step"
    )
    inner = vars(t.FSDPEngine)["forward_backward_batch"].__wrapped__
    result["fsdp_inner"] = inner.__code__.co_filename
    micro.undo()
    result["fsdp_restored"] = vars(t.FSDPEngine)["forward_backward_batch"] is inner
mini.undo()
# The stage hooks (verl's step count) stay; the recipe's own hooks are gone.
result["restored"] = [h.__class__.__name__ for h in windows._sites.get(
    (id(w.TrainingWorker), "train_batch"), windows.Site((0, ""))).hooks]
print(json.dumps(result))
"""


def rl_python() -> Path:
    from support.engine_venvs import venv_dir

    python = venv_dir("rl") / "bin" / "python"
    if not (venv_dir("rl") / "mstx_marks-complete").is_file() or not python.is_file():
        pytest.skip("the rl venv (real verl 0.9.1) is not built here")
    return python


@pytest.fixture(scope="module")
def real_verl(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = rl_python()
    out = tmp_path_factory.mktemp("real_verl")
    repo = Path(__file__).resolve().parents[1]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    environ.update(PYTHONPATH=str(repo), MSTX_MARKS_ROLE="actor", VERL_USE_EXTERNAL_PLUGINS="0")
    done = subprocess.run(
        [str(python), "-c", REAL_VERL_SCRIPT, str(out)],
        capture_output=True, text=True, env=environ, timeout=600, cwd=out,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["out"] = str(out)
    return result


def test_real_verl_worker_loops_are_wrapped_and_keep_register(
    real_verl: dict[str, Any],
) -> None:
    assert real_verl["worker_ours"] is True
    assert real_verl["register_attr"] is True
    assert real_verl["restored"] == []


def test_real_verl_fsdp_loop_and_forward_step_are_wrapped(real_verl: dict[str, Any]) -> None:
    if "fsdp_error" in real_verl:
        pytest.skip(f"the rl venv cannot import the FSDP engine: {real_verl['fsdp_error']}")
    assert real_verl["fsdp_ours"] is True
    assert real_verl["fsdp_inner"].endswith("transformer_impl.py")
    assert real_verl["fsdp_restored"] is True


# --- the real vLLM 0.32 (CPU build), in its venv ---------------------------------------------

REAL_VLLM_SCRIPT = r"""
import json, sys
from mstx_marks.profiling import recipes, windows

handle = recipes.capture("rollout_decode", active=1, out=sys.argv[1])
assert "vllm.v1.worker.gpu_worker" not in sys.modules
import vllm.v1.worker.cpu_worker as cpu
import vllm.v1.worker.gpu_worker as gpu

wrapped = vars(gpu.Worker)["execute_model"]
result = {
    "ours": wrapped.__code__.co_filename == windows.__file__,
    "cpu_inherits": cpu.CPUWorker.execute_model is wrapped,
    "name": wrapped.__name__,
}
handle.undo()
result["restored"] = vars(gpu.Worker)["execute_model"] is wrapped.__wrapped__
print(json.dumps(result))
"""


def test_real_vllm_worker_execute_model_is_wrapped_after_import(tmp_path: Path) -> None:
    from support.engine_venvs import venv_dir

    python = venv_dir("vllm") / "bin" / "python"
    if not (venv_dir("vllm") / "mstx_marks-complete").is_file() or not python.is_file():
        pytest.skip("the vllm venv (real vLLM 0.32, CPU) is not built here")
    repo = Path(__file__).resolve().parents[1]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    environ["PYTHONPATH"] = str(repo)
    done = subprocess.run(
        [str(python), "-c", REAL_VLLM_SCRIPT, str(tmp_path)],
        capture_output=True, text=True, env=environ, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"ours": True, "cpu_inherits": True, "name": "execute_model", "restored": True}


def test_a_loop_that_ends_early_is_stopped_at_exit_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warned: Any
) -> None:
    monkeypatch.setenv("MSTX_MARKS_ROLE", "rollout")
    Worker = make_vllm_worker()
    stand_in(monkeypatch, GPU_WORKER, Worker=Worker)
    original = vars(Worker)["execute_model"]
    handle = recipes.capture("rollout_decode", wait=0, warmup=0, active=5, out=str(tmp_path))
    Worker().execute_model(0)  # 1 of 5 active steps, then the process ends
    with warned() as w:
        captures._stop_unfinished()  # what atexit runs
    assert handle.done and vars(Worker)["execute_model"] is original
    messages = [str(x.message) for x in w]
    assert any("ends after 1 of its 5 steps" in m for m in messages), messages
    assert traced_names(tmp_path / "vllm_profile") == ["call0"]  # what ran is kept
