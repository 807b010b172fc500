"""Profiler recipes (mstx_marks.profiling.recipes): real torch.profiler traces over stand-in
framework classes, the post-import wait, ref/actor, MSTX_MARKS_CAPTURE parsing, and (when its venv
exists) the real verl.

The stand-ins are test-made classes registered in ``sys.modules`` under the real frameworks'
module names (``vllm.v1.worker.gpu_worker``, ``verl.workers.engine.fsdp.transformer_impl``,
``verl.workers.engine_workers``), with the methods the recipes patch.
"""

from __future__ import annotations

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
from mstx_marks.profiling import recipes

torch = pytest.importorskip("torch")

GPU_WORKER = "vllm.v1.worker.gpu_worker"
ASCEND_WORKER = "vllm_ascend.worker.worker"
FSDP = "verl.workers.engine.fsdp.transformer_impl"
ENGINE_WORKERS = "verl.workers.engine_workers"
VERL_REGISTER_ATTR = "attrs_3141562937"  # where verl's @register keeps its dispatch settings


@pytest.fixture(autouse=True)
def disarm_all() -> Iterator[None]:
    """No capture outlives its test; every patched site is restored."""
    yield
    for handle in recipes.armed():
        handle.undo()
    assert recipes._sites == {}
    assert recipes._running is None


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
    assert handle.steps == 3 and not handle.done
    assert worker.execute_model(3) == 30  # active, last step: the profiler stops

    assert handle.done and handle.steps == 4
    assert vars(Worker)["execute_model"] is original
    assert worker.execute_model(4) == 40  # after the schedule: the original, unprofiled
    folder = tmp_path / "rollout_rollout_decode"
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
    files = sorted((tmp_path / "rollout_rollout_decode").glob("*.pt.trace.json"))
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
    assert handle.steps == 2
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
        assert list((tmp_path / "out").glob("*_rollout_decode/*.pt.trace.json"))
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
    recipes._attach(handle, GPU_WORKER, "Worker.execute_model", module)  # the hook, run late
    assert vars(Worker)["execute_model"] is original


# --- verl FSDP engine stand-in: ref / actor / update micro-batches -------------------------------


def make_fsdp_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    class FSDPEngine:  # stand-in for verl's FSDPEngine (forward_backward_batch's loop)
        def __init__(self, name: str, forward_only_config: bool) -> None:
            self.name = name
            self.engine_config = types.SimpleNamespace(forward_only=forward_only_config)
            self.optimizer = None if forward_only_config else object()

        def forward_backward_batch(self, n: int, forward_only: bool) -> list[str]:
            return [
                self.forward_step(i, loss_function=None, forward_only=forward_only)
                for i in range(n)
            ]

    class FSDPEngineWithLMHead(FSDPEngine):
        def forward_step(self, micro_batch: int, loss_function: Any, forward_only: bool) -> str:
            kind = "logprob" if forward_only else "train"
            label = f"{self.name}_{kind}_mb{micro_batch}"
            with torch.profiler.record_function(label):
                return label

    return stand_in(
        monkeypatch, FSDP, FSDPEngine=FSDPEngine, FSDPEngineWithLMHead=FSDPEngineWithLMHead
    )


def test_ref_and_actor_log_prob_micro_batches_are_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsdp = make_fsdp_module(monkeypatch)
    original = vars(fsdp.FSDPEngineWithLMHead)["forward_step"]
    ref_cap = recipes.capture("ref_log_prob_micro_batch", active=2, out=str(tmp_path))
    actor_cap = recipes.capture("actor_log_prob_micro_batch", active=2, out=str(tmp_path))
    ref = fsdp.FSDPEngineWithLMHead("ref", forward_only_config=True)
    actor = fsdp.FSDPEngineWithLMHead("actor", forward_only_config=False)

    assert actor.forward_backward_batch(2, forward_only=False) == [
        "actor_train_mb0",
        "actor_train_mb1",
    ]
    assert (ref_cap.steps, actor_cap.steps) == (0, 0)  # a training micro-batch is neither
    assert ref.forward_backward_batch(2, forward_only=True) == [
        "ref_logprob_mb0",
        "ref_logprob_mb1",
    ]
    assert ref_cap.done and actor_cap.steps == 0
    actor.forward_backward_batch(3, forward_only=True)
    assert actor_cap.done and actor_cap.steps == 2

    assert vars(fsdp.FSDPEngineWithLMHead)["forward_step"] is original
    assert (ref_cap.role, actor_cap.role) == ("ref", "actor")
    assert traced_names(tmp_path / "ref_ref_log_prob_micro_batch") == [
        "ref_logprob_mb0",
        "ref_logprob_mb1",
    ]
    assert traced_names(tmp_path / "actor_actor_log_prob_micro_batch") == [
        "actor_logprob_mb0",
        "actor_logprob_mb1",
    ]


def test_without_the_config_flag_the_ref_is_the_engine_without_optimizer() -> None:
    assert recipes._is_ref(types.SimpleNamespace(optimizer=None))
    assert not recipes._is_ref(types.SimpleNamespace(optimizer=object()))
    flag_wins = types.SimpleNamespace(
        engine_config=types.SimpleNamespace(forward_only=False), optimizer=None
    )
    assert not recipes._is_ref(flag_wins)


def test_positional_forward_only_is_read_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsdp = make_fsdp_module(monkeypatch)
    cap = recipes.capture("update_micro_batch", active=3, out=str(tmp_path))
    engine = fsdp.FSDPEngineWithLMHead("actor", forward_only_config=False)
    engine.forward_step(0, None, True)  # forward-only: not a training micro-batch
    engine.forward_step(1, None, False)
    assert cap.steps == 1
    # A forward_step whose forward_only cannot be read counts for none of the verl recipes.
    for name in ("ref_log_prob_micro_batch", "actor_log_prob_micro_batch", "update_micro_batch"):
        assert recipes._COUNTS[name]((engine, 0, None), {}) is False
        assert recipes._COUNTS[name]((engine, 0), {"forward_only": None}) is False


def test_one_profiler_at_a_time_the_second_recipe_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsdp = make_fsdp_module(monkeypatch)
    ref_cap = recipes.capture("ref_log_prob_micro_batch", active=2, out=str(tmp_path))
    actor_cap = recipes.capture("actor_log_prob_micro_batch", active=1, out=str(tmp_path))
    ref = fsdp.FSDPEngineWithLMHead("ref", forward_only_config=True)
    actor = fsdp.FSDPEngineWithLMHead("actor", forward_only_config=False)

    ref.forward_step(0, None, forward_only=True)  # ref's profiler runs from here
    actor.forward_step(0, None, forward_only=True)  # not counted: ref's profiler runs
    assert (ref_cap.steps, actor_cap.steps) == (1, 0)
    ref.forward_step(1, None, forward_only=True)
    assert ref_cap.done
    actor.forward_step(1, None, forward_only=True)
    assert actor_cap.done
    assert traced_names(tmp_path / "actor_actor_log_prob_micro_batch") == ["actor_logprob_mb1"]


def test_update_micro_batch_counts_training_micro_batches_in_the_process_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MSTX_MARKS_ROLE", "critic")
    fsdp = make_fsdp_module(monkeypatch)
    cap = recipes.capture("update_micro_batch", wait=1, active=1, out=str(tmp_path))
    engine = fsdp.FSDPEngineWithLMHead("critic", forward_only_config=False)
    engine.forward_backward_batch(2, forward_only=True)
    assert cap.steps == 0
    engine.forward_backward_batch(3, forward_only=False)
    assert cap.done
    assert traced_names(tmp_path / "critic_update_micro_batch") == ["critic_train_mb1"]


# --- update_mini_batch over a stand-in TrainingWorker --------------------------------------------


class FakeDistProfiler:
    """verl's DistProfiler as the recipes see it: check_enable()."""

    def __init__(self, enabled: object) -> None:
        self.enabled = enabled

    def check_enable(self) -> bool:
        if isinstance(self.enabled, Exception):
            raise self.enabled
        return bool(self.enabled)


def make_training_worker(monkeypatch: pytest.MonkeyPatch) -> type:
    def train_batch(self: Any, data: int) -> int:
        with torch.profiler.record_function(f"mini_batch{data}"):
            return data * 2

    setattr(train_batch, VERL_REGISTER_ATTR, {"dispatch_mode": "nd", "blocking": False})

    class TrainingWorker:  # stand-in for verl.workers.engine_workers.TrainingWorker
        def __init__(self, profiler: Any = None) -> None:
            if profiler is not None:
                self.profiler = profiler

        def train_mini_batch(self, n: int) -> list[int]:
            return [self.train_batch(i) for i in range(n)]

    TrainingWorker.train_batch = train_batch  # type: ignore[attr-defined]
    stand_in(monkeypatch, ENGINE_WORKERS, TrainingWorker=TrainingWorker)
    return TrainingWorker


def test_update_mini_batch_keeps_verls_register_attribute_and_warns_about_its_profiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warned: Any
) -> None:
    monkeypatch.setenv("MSTX_MARKS_ROLE", "actor")
    TrainingWorker = make_training_worker(monkeypatch)
    cap = recipes.capture("update_mini_batch", warmup=1, active=2, out=str(tmp_path))
    wrapped = vars(TrainingWorker)["train_batch"]
    assert getattr(wrapped, VERL_REGISTER_ATTR) == {"dispatch_mode": "nd", "blocking": False}
    with warned() as got:
        assert TrainingWorker(FakeDistProfiler(True)).train_mini_batch(4) == [0, 2, 4, 6]
    assert our_warnings(got) == [f"mstx_marks: {recipes._VERL_WARNING}"]
    assert "global_profiler.steps=null" in recipes._VERL_WARNING
    assert cap.done
    assert traced_names(tmp_path / "actor_update_mini_batch") == ["mini_batch1", "mini_batch2"]


@pytest.mark.parametrize("profiler", [None, FakeDistProfiler(False), FakeDistProfiler(OSError())])
def test_no_verl_profiler_warning_when_it_is_off_or_the_probe_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warned: Any, profiler: Any
) -> None:
    TrainingWorker = make_training_worker(monkeypatch)
    cap = recipes.capture("update_mini_batch", active=1, out=str(tmp_path))
    with warned() as got:
        assert TrainingWorker(profiler).train_batch(3) == 6
    assert our_warnings(got) == []
    assert cap.done


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
    assert cap.done and cap.steps == 0
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def record(**kwargs: Any) -> Any:
        seen.update(kwargs)
        return StepFails()

    monkeypatch.setattr(mstx_marks.profiling.profiler, "build_profiler", record)
    monkeypatch.setenv("MSTX_MARKS_ROLE", "rollout")
    stand_in(monkeypatch, GPU_WORKER, Worker=make_vllm_worker())
    cap = recipes.capture(
        "rollout_decode", wait=29, warmup=1, active=30, repeat=2, level="Level2", export="text",
        out=str(tmp_path),
    )  # fmt: skip
    sys.modules[GPU_WORKER].Worker().execute_model(0)
    assert seen == {
        "contents": ("npu", "cpu"),
        "level": "level2",
        "export": "text",
        "save_path": str(tmp_path / "rollout_rollout_decode"),
        "wait": 29,
        "warmup": 1,
        "active": 30,
        "repeat": 2,
    }
    assert cap.total == 120


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
        assert cap.out == str(tmp_path / "mstx_marks_capture")
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


def test_recipes_table_lists_every_recipe_target_and_hand_edit() -> None:
    table = recipes.recipes_table()
    assert [r.name for r in recipes.RECIPES] == [
        "rollout_decode",
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
        for module, path in r.targets:
            assert f"{module}:{path}" in table
    assert "Megatron supports mini-batch only" in table
    assert "<out>/ref_ref_log_prob_micro_batch" in table
    assert max(len(line) for line in table.splitlines()) < 200


# --- the real verl 0.9.1, in its venv ------------------------------------------------------

REAL_VERL_SCRIPT = r"""
import json, os, sys, warnings
from mstx_marks import MstxMarksWarning
from mstx_marks.profiling import recipes

out = sys.argv[1]
result = {}
mini = recipes.capture("update_mini_batch", active=1, out=out)
ref = recipes.capture("ref_log_prob_micro_batch", active=1, out=out)
assert "verl.workers.engine_workers" not in sys.modules
import verl.workers.engine_workers as w
from verl.utils.profiler import DistProfiler, ProfilerConfig
from verl.utils.profiler.config import TorchProfilerToolConfig

wrapped = vars(w.TrainingWorker)["train_batch"]
result["ours"] = wrapped.__code__.co_filename == recipes.__file__
result["register_attr"] = getattr(wrapped, "attrs_3141562937", None) is getattr(
    wrapped.__wrapped__, "attrs_3141562937", 0
)
original = wrapped.__wrapped__

class StandInSelf:  # what train_batch's first line reads: loss_fn None fails its assert
    loss_fn = None
    config = ProfilerConfig(enable=True, tool="torch", tool_config=TorchProfilerToolConfig())
    profiler = DistProfiler(rank=0, config=config)

with warnings.catch_warnings(record=True) as got:
    warnings.simplefilter("always")
    try:
        w.TrainingWorker.train_batch(StandInSelf(), None)
    except AssertionError as exc:
        result["error"] = str(exc)
result["warnings"] = [str(x.message) for x in got if issubclass(x.category, MstxMarksWarning)]
result["done"] = mini.done
result["restored"] = vars(w.TrainingWorker)["train_batch"] is original
result["traces"] = sorted(os.listdir(mini.save_path)) if mini.save_path else []
try:
    import verl.workers.engine.fsdp.transformer_impl as t
except ImportError as exc:
    result["fsdp_error"] = f"{type(exc).__name__}: {exc}"
else:
    step = vars(t.FSDPEngineWithLMHead)["forward_step"]
    result["fsdp_ours"] = step.__code__.co_filename == recipes.__file__
    result["fsdp_inner"] = step.__wrapped__.__code__.co_filename
    ref.undo()
    result["fsdp_restored"] = vars(t.FSDPEngineWithLMHead)["forward_step"] is step.__wrapped__
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


def test_real_verl_train_batch_is_wrapped_keeps_register_and_captures(
    real_verl: dict[str, Any],
) -> None:
    assert real_verl["ours"] is True
    assert real_verl["register_attr"] is True
    assert "loss function can't be None" in real_verl["error"]  # verl's own assert, untouched
    assert any("global_profiler.steps=null" in m for m in real_verl["warnings"])
    assert real_verl["done"] is True and real_verl["restored"] is True
    assert any(name.endswith(".pt.trace.json") for name in real_verl["traces"])
    assert (Path(real_verl["out"]) / "actor_update_mini_batch").is_dir()


def test_real_verl_fsdp_forward_step_is_wrapped(real_verl: dict[str, Any]) -> None:
    if "fsdp_error" in real_verl:
        pytest.skip(f"the rl venv cannot import the FSDP engine: {real_verl['fsdp_error']}")
    assert real_verl["fsdp_ours"] is True
    assert real_verl["fsdp_inner"].endswith("transformer_impl.py")
    assert real_verl["fsdp_restored"] is True


# --- the real vLLM 0.32 (CPU build), in its venv ---------------------------------------------

REAL_VLLM_SCRIPT = r"""
import json, sys
from mstx_marks.profiling import recipes

handle = recipes.capture("rollout_decode", active=1, out=sys.argv[1])
assert "vllm.v1.worker.gpu_worker" not in sys.modules
import vllm.v1.worker.cpu_worker as cpu
import vllm.v1.worker.gpu_worker as gpu

wrapped = vars(gpu.Worker)["execute_model"]
result = {
    "ours": wrapped.__code__.co_filename == recipes.__file__,
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
        recipes._stop_unfinished()  # what atexit runs
    assert handle.done and vars(Worker)["execute_model"] is original
    messages = [str(x.message) for x in w]
    assert any("ends after 1 of its 5 steps" in m for m in messages), messages
    assert traced_names(tmp_path / "rollout_rollout_decode") == ["call0"]  # what ran is kept
