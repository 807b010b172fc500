"""Presets on stand-ins of the frameworks' modules (the real engines run in test_engine_*.py):
each stand-in below copies the shape of the real code it names (file:line in the docstrings of
mstx_marks/presets/), which is all a preset touches."""

from __future__ import annotations

import functools
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.stand_ins import fake_module

import mstx_marks
from mstx_marks.capture import presets
from mstx_marks.capture.presets.target import Options
from mstx_marks.capture.presets.verl import inside_annotation
from mstx_marks.capture.presets.vllm import batch_kind
from mstx_marks.launch.activate import parse_instrument, parse_samples

# --- a stand-in of verl 0.9.1's decorators (verl/utils/profiler/profile.py:333-379 and
# single_controller/base/decorator.py:398-443): register(DistProfiler.annotate(f)) ------------

MAGIC_ATTR = "attrs_3141562937"


class DistProfiler:
    @classmethod
    def annotate(cls, message: str | None = None, **kwargs_outer: Any) -> Any:
        def decorator(func: Any) -> Any:
            @functools.wraps(func)
            def wrapper(self_instance: Any, *args: Any, **kwargs_inner: Any) -> Any:
                log = self_instance.log
                profiler = self_instance.profiler
                if not profiler.active:
                    return func(self_instance, *args, **kwargs_inner)
                if profiler.discrete:
                    log.append("verl profiler start")
                log.append(f"verl range {kwargs_outer['role']}")
                result = func(self_instance, *args, **kwargs_inner)
                log.append("verl range end")
                if profiler.discrete:
                    log.append("verl profiler stop")
                return result

            return wrapper

        return decorator


def register(func: Any) -> Any:
    @functools.wraps(func)
    def inner(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    setattr(inner, MAGIC_ATTR, {"dispatch_mode": "nd"})
    return inner


class Profiler:
    def __init__(self, active: bool, discrete: bool) -> None:
        self.active, self.discrete = active, discrete
        self._impl = self

    def check_enable(self) -> bool:
        return self.active

    check_this_step = check_this_rank = check_enable

    def annotate(self) -> None:  # verl's impls have one; _verl_emits_its_own looks for it
        pass


class Worker:
    def __init__(self, profiler: Profiler) -> None:
        self.profiler, self.log = profiler, []

    @register
    @DistProfiler.annotate(role="actor_compute_log_prob")
    def compute_log_prob(self, batch: int) -> int:
        self.log.append("stage")
        return batch * 2


class Logging(mstx_marks.backends.Backend):
    """Appends our range starts and ends to the worker's log: one order for both."""

    name = "logging"

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def emitter(self, stream: object) -> mstx_marks.backends.Emitter:
        def start(name: str, domain: str) -> int:
            self.log.append(f"ours {name}")
            return 1

        def end(handle: int, domain: str) -> None:
            self.log.append("ours end")

        return mstx_marks.backends.Emitter(self, start, end, lambda n, d: None)


def _patched_worker(profiler: Profiler, duplicate: bool = False) -> tuple[Worker, Any]:
    target = presets.Target(
        "verl", __name__, "Worker.compute_log_prob", "compute_log_prob", "0.9.1",
        inside_annotation,
    )  # fmt: skip
    before = Worker.__dict__["compute_log_prob"]
    handle = inside_annotation(
        Worker, "compute_log_prob", target, Options(duplicate_verl=duplicate)
    )
    w = Worker(profiler)
    mstx_marks.configure(backend=Logging(w.log))
    assert Worker.__dict__["compute_log_prob"] is before  # the class attribute is untouched
    return w, handle


def test_discrete_mode_our_range_is_inside_verls_profiler_window() -> None:
    w, handle = _patched_worker(Profiler(active=True, discrete=True))
    try:
        assert w.compute_log_prob(21) == 42
        assert w.log == [
            "verl profiler start",
            "verl range actor_compute_log_prob",
            "ours compute_log_prob",
            "stage",
            "ours end",
            "verl range end",
            "verl profiler stop",
        ]
        assert getattr(Worker.compute_log_prob, MAGIC_ATTR) == {"dispatch_mode": "nd"}
    finally:
        handle.undo()
    w.log.clear()
    w.compute_log_prob(1)
    assert "ours compute_log_prob" not in w.log  # undo put the stage back


@pytest.mark.parametrize(("duplicate", "ours"), [(False, 0), (True, 1)])
def test_continuous_mode_no_duplicate_unless_asked(duplicate: bool, ours: int) -> None:
    w, handle = _patched_worker(Profiler(active=True, discrete=False), duplicate)
    with handle:
        w.compute_log_prob(1)
    assert w.log.count("ours compute_log_prob") == ours
    assert w.log.count("verl range actor_compute_log_prob") == 1


def test_profiler_off_ours_is_the_only_range() -> None:
    w, handle = _patched_worker(Profiler(active=False, discrete=False))
    with handle:
        w.compute_log_prob(1)
    assert w.log == ["ours compute_log_prob", "stage", "ours end"]


# --- vLLM's SchedulerOutput (vllm/v1/core/sched/output.py) and rule (v1/utils.py:835) ---------


class Cached:
    def __init__(self, context: set[str]) -> None:
        self.context = context

    def is_context_phase(self, req_id: str) -> bool:
        return req_id in self.context


class New:
    def __init__(self, req_id: str) -> None:
        self.req_id = req_id


def _output(tokens: dict[str, int], new: list[str] = (), context: set[str] = frozenset()) -> Any:  # type: ignore[assignment]
    out = type("SchedulerOutput", (), {})()
    out.total_num_scheduled_tokens = sum(tokens.values())
    out.num_scheduled_tokens = tokens
    out.scheduled_new_reqs = [New(r) for r in new]
    out.scheduled_cached_reqs = Cached(set(context))
    return out


@pytest.mark.parametrize(
    ("output", "kind"),
    [
        (_output({"a": 7}, new=["a"]), "prefill_batch"),
        (_output({"a": 1, "b": 1}), "decode_batch"),
        (_output({"a": 7, "b": 1}, new=["a"]), "mixed_batch"),
        (_output({"a": 16}, context={"a"}), "prefill_batch"),  # a chunked prefill's next chunk
        (_output({}), None),
    ],
)
def test_batch_kind_follows_vllms_rule(output: Any, kind: str | None) -> None:
    assert batch_kind(output) == kind


# --- arming, activation, and saying so when nothing was patched ------------------------------


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A stand-in ``vllm`` package with the two modules the preset patches."""
    core = tmp_path / "vllm" / "v1" / "engine"
    worker = tmp_path / "vllm" / "v1" / "worker"
    core.mkdir(parents=True)
    worker.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "v1", core, worker):
        (d / "__init__.py").write_text("")
    (core / "core.py").write_text(
        textwrap.dedent(
            """
            class Scheduler:
                def __init__(self, pending):
                    self.pending = pending
                def has_requests(self):
                    return self.pending > 0

            class EngineCore:
                def __init__(self, pending):
                    self.scheduler = Scheduler(pending)
                def step(self):
                    if not self.scheduler.has_requests():
                        return {}, False
                    self.scheduler.pending -= 1
                    return {0: "out"}, True
            """
        )
    )
    (worker / "gpu_worker.py").write_text("class Worker:\n    pass\n")  # no execute_model
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


def test_armed_preset_patches_at_import_and_skips_idle_polls(
    fake_vllm: Path, recorder: mstx_marks.Recorder
) -> None:
    presets.arm("vllm", Options(phase_samples=parse_samples("vllm_one_step=every(2)")))
    from vllm.v1.engine.core import EngineCore  # type: ignore[import-not-found]

    engine = EngineCore(pending=4)
    results = [engine.step() for _ in range(6)]  # 4 steps with requests, then 2 idle polls
    assert [r[1] for r in results] == [True] * 4 + [False] * 2
    steps = [r for r in recorder.records() if r.name == "vllm_one_step"]
    assert len(steps) == 2  # every(2) of the 4 real steps; idle polls are no step
    assert {r.domain for r in steps} == {"vllm_one_step"}


def test_a_module_with_none_of_its_targets_says_so_once(fake_vllm: Path) -> None:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        presets.arm("vllm")
        import vllm.v1.worker.gpu_worker  # type: ignore[import-not-found]  # noqa: F401
    ours = [str(x.message) for x in w if x.category is mstx_marks.MstxMarksWarning]
    assert len(ours) == 1
    assert "vllm.v1.worker.gpu_worker has none of Worker.execute_model" in ours[0]


def test_apply_reports_what_it_could_not_import() -> None:
    report = presets.apply("sglang")
    assert report.patched == ()
    ((label, why),) = report.skipped
    assert label == "sglang.srt.model_executor.model_runner:ModelRunner.forward"
    assert "ModuleNotFoundError" in why


def test_bad_activation_text_warns_and_the_rest_applies() -> None:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert parse_instrument("verl,bogus, vllm") == ("verl", "vllm")
        samples = parse_samples("gen=every(2);oops;decode=window(5,1)")
    assert sorted(samples) == ["generate_sequences"]
    messages = [str(x.message) for x in w]
    # one warning per variable: the first bad part named with its rule, the others counted
    assert len(messages) == 2
    assert "MSTX_MARKS_INSTRUMENT='verl,bogus, vllm'" in messages[0]
    assert "'oops'" in messages[1] and "PHASE=POLICY" in messages[1]
    assert "1 more bad pair" in messages[1]


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    armed = dict(presets._armed)
    yield
    presets._armed.clear()
    presets._armed.update(armed)
    from mstx_marks.base import import_hooks

    import_hooks._pending.clear()


# --- apply(): import and patch now; stand-in modules put in sys.modules --------------------------


class _Scheduler:
    def __init__(self, pending: int) -> None:
        self.pending = pending

    def has_requests(self) -> bool:
        return self.pending > 0


class EngineCore:
    """Shaped like vllm/v1/engine/core.py's: step() returns (outputs, model_executed)."""

    def __init__(self, pending: int) -> None:
        self.scheduler = _Scheduler(pending)
        self.done = 0

    def step(self) -> tuple[dict[int, int], bool]:
        if not self.scheduler.has_requests():
            return {}, False
        mstx_marks.instant(f"step{self.done}")
        self.done += 1
        self.scheduler.pending -= 1
        return {0: self.done}, True


def test_vllm_engine_steps_30_to_69_of_200_and_undo_restores(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    fake_module(monkeypatch, "vllm.v1.engine.core", EngineCore=EngineCore)
    before = dict(vars(EngineCore))
    report = presets.apply("vllm", sample=mstx_marks.window(30, 70))
    assert report.patched == ("vllm.v1.engine.core:EngineCore.step",)
    engine = EngineCore(200)
    outputs = [engine.step() for _ in range(201)]
    report.undo()
    assert [o[1] for o in outputs] == [True] * 200 + [False]
    records = recorder.records()
    ranges = [r for r in records if r.kind == "range"]
    assert len(ranges) == 40 and {r.domain for r in ranges} == {"vllm_one_step"}
    # each range holds the instant its step emitted: steps 30..69 exactly
    marked = [
        int(i.name[4:]) for i in records if i.kind == "instant"
        and any(r.start_ns <= i.start_ns <= r.end_ns for r in ranges)
    ]  # fmt: skip
    assert marked == list(range(30, 70))
    assert dict(vars(EngineCore)) == before


def test_verl_legacy_workers_are_wrapped_and_the_rest_reported(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    class ActorRolloutRefWorker:  # verl <= 0.7 fsdp_workers, without the profiler decorators
        def generate_sequences(self, prompts: list[int]) -> list[int]:
            return [p + 1 for p in prompts]

        def update_actor(self, data: int) -> int:
            return data

    fake_module(
        monkeypatch, "verl.workers.fsdp_workers", ActorRolloutRefWorker=ActorRolloutRefWorker
    )
    before = dict(vars(ActorRolloutRefWorker))
    with presets.apply("verl") as report:
        assert ActorRolloutRefWorker().generate_sequences([1, 2]) == [2, 3]
        ActorRolloutRefWorker().update_actor(0)
        assert presets.apply("verl").patched == ()  # never wrapped twice
    assert report.patched == (
        "verl.workers.fsdp_workers:ActorRolloutRefWorker.generate_sequences",
        "verl.workers.fsdp_workers:ActorRolloutRefWorker.update_actor",
    )
    why = dict(report.skipped)
    assert "not in verl" in why["verl.workers.fsdp_workers:CriticWorker.compute_values"]
    assert "ModuleNotFoundError" in why["verl.workers.engine_workers:TrainingWorker.train_batch"]
    assert [r.name for r in recorder.records()] == ["generate_sequences", "update_actor"]
    assert dict(vars(ActorRolloutRefWorker)) == before


def test_sglang_forward_by_batch_kind(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    class Mode:
        def __init__(self, kind: str) -> None:
            self.kind = kind

        def is_idle(self) -> bool:
            return self.kind == "idle"

        def is_decode(self) -> bool:
            return self.kind == "decode"

    class Batch:
        def __init__(self, kind: str) -> None:
            self.forward_mode = Mode(kind)
            self.batch_size = 3
            self.extend_num_tokens = 96 if kind == "extend" else None

    class ModelRunner:  # sglang/srt/model_executor/model_runner.py:1813
        def forward(self, forward_batch: Batch, skip_attn_backend_init: bool = False) -> str:
            return forward_batch.forward_mode.kind

    fake_module(monkeypatch, "sglang.srt.model_executor.model_runner", ModelRunner=ModelRunner)
    with presets.apply("sglang"):
        kinds = [ModelRunner().forward(Batch(k)) for k in ("extend", "decode", "idle", "decode")]
    assert kinds == ["extend", "decode", "idle", "decode"]
    assert [(r.name, r.domain, r.args) for r in recorder.records()] == [
        ("prefill_batch", "sglang", {"reqs": 3, "tokens": 96}),
        ("decode_batch", "sglang", {"reqs": 3, "tokens": 3}),
        ("decode_batch", "sglang", {"reqs": 3, "tokens": 3}),
    ]


def test_every_target_names_a_registered_phase_and_a_real_path() -> None:
    from mstx_marks.base import phases

    assert {t.framework for t in presets.TARGETS} == set(presets.FRAMEWORKS)
    for t in presets.TARGETS:
        if t.phase not in ("(timer names)", "(live figures)"):
            phases.lookup(t.phase)  # raises for a name the registry does not know
        assert all(part.isidentifier() for part in t.module.split(".") + t.path.split("."))
    assert len(set(presets.TARGETS)) == len(presets.TARGETS)


# --- verl: subclasses that override a patched method, the reward loop, the exit warning ----------


def test_a_subclass_override_is_patched_before_and_after_and_undone(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    from mstx_marks.capture.presets.target import covered

    class AgentLoopWorker:  # verl/experimental/agent_loop/agent_loop.py:481 (async method)
        async def generate_sequences(self, batch: int) -> int:
            return batch

    class Early(AgentLoopWorker):  # exists when the preset patches the base
        async def generate_sequences(self, batch: int) -> int:
            return batch + 1

    class Inherits(AgentLoopWorker):  # no override: the base's wrapper serves it
        pass

    fake_module(
        monkeypatch, "verl.experimental.agent_loop.agent_loop", AgentLoopWorker=AgentLoopWorker
    )
    before = {c: dict(vars(c)) for c in (AgentLoopWorker, Early, Inherits)}
    with presets.apply("verl") as report:

        class Late(Early):  # created afterwards (as Ray rebuilds AgentLoopWorkerTQ in an actor)
            async def generate_sequences(self, batch: int) -> int:
                return batch + 2

        class Later(Late):  # no override of its own
            pass

        assert all(covered(vars(c)["generate_sequences"]) for c in (Early, Late))
        assert "generate_sequences" not in vars(Later)
        import asyncio
        import inspect

        assert inspect.iscoroutinefunction(Late.generate_sequences)
        results = [
            asyncio.run(c().generate_sequences(1)) for c in (AgentLoopWorker, Early, Late, Later)
        ]
        assert presets.apply("verl").patched == ()  # never twice, subclasses included
        assert f"{__name__}:{Late.__qualname__}.generate_sequences" in presets.patched("verl")
    assert results == [1, 2, 3, 3]
    assert [r.name for r in recorder.records()] == ["generate_sequences"] * 4  # one per call
    assert report.patched == (
        "verl.experimental.agent_loop.agent_loop:AgentLoopWorker.generate_sequences",
        f"{__name__}:{Early.__qualname__}.generate_sequences",
    )
    assert {c: dict(vars(c)) for c in (AgentLoopWorker, Early, Inherits)} == before
    assert not covered(vars(Late)["generate_sequences"])  # undone too

    class AfterUndo(AgentLoopWorker):
        async def generate_sequences(self, batch: int) -> int:
            return batch

    assert not covered(vars(AfterUndo)["generate_sequences"])  # the hook is gone


def test_a_base_with_its_own_init_subclass_keeps_it() -> None:
    from mstx_marks.capture.presets.target import Options, Target, patch_target

    seen: list[tuple[str, Any]] = []

    class Base:
        def __init_subclass__(cls, tag: Any = None, **kwargs: Any) -> None:
            super().__init_subclass__(**kwargs)
            seen.append((cls.__name__, tag))

        def run(self) -> str:
            return "base"

    t = Target("verl", __name__, "Base.run", "step", "any")
    handle = patch_target(t, Base, "run", Options(), "x:Base.run")
    try:

        class Sub(Base, tag="t"):
            def run(self) -> str:
                return "sub"

        assert Sub().run() == "sub" and handle.patched == ("x:Base.run",)
    finally:
        handle.undo()
    assert seen == [("Sub", "t")]
    assert isinstance(vars(Base)["__init_subclass__"], classmethod)  # its own, put back


async def _overlapping_scores(worker: Any) -> list[float]:
    import asyncio

    return await asyncio.gather(*(worker.compute_score(d) for d in (0.3, 0.1, 0.2)))


def test_reward_loop_worker_calls_overlap_and_each_range_ends_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    log: list[tuple[str, Any]] = []

    class RewardLoopWorker:  # verl/experimental/reward_loop/reward_loop.py:145 (0.9.1)
        async def compute_score(self, delay: float) -> float:
            await asyncio.sleep(delay)
            log.append(("scored", delay))
            return delay

    class Ids(mstx_marks.backends.Backend):
        name = "ids"

        def emitter(self, stream: object) -> mstx_marks.backends.Emitter:
            ids = iter(range(1, 100))

            def start(name: str, domain: str) -> int:
                rid = next(ids)
                log.append(("start", rid))
                return rid

            return mstx_marks.backends.Emitter(
                self, start, lambda rid, d: log.append(("end", rid)), lambda n, d: None
            )

    fake_module(
        monkeypatch, "verl.experimental.reward_loop.reward_loop", RewardLoopWorker=RewardLoopWorker
    )
    mstx_marks.configure(backend=Ids())
    with presets.apply("verl") as report:
        assert asyncio.run(_overlapping_scores(RewardLoopWorker())) == [0.3, 0.1, 0.2]
    assert "verl.experimental.reward_loop.reward_loop:RewardLoopWorker.compute_score" in (
        report.patched
    )
    # All three open at once; each ends right after its own score, exactly once.
    assert log[:3] == [("start", 1), ("start", 2), ("start", 3)]
    assert log[3:] == [
        ("scored", 0.1), ("end", 2), ("scored", 0.2), ("end", 3), ("scored", 0.3), ("end", 1),
    ]  # fmt: skip


def test_nothing_patched_warns_only_where_a_targeted_module_was_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m == "verl" or m.startswith("verl.")]:
        monkeypatch.delitem(sys.modules, name)
    fake_module(monkeypatch, "verl")  # a Ray driver: verl imported, no worker module
    monkeypatch.setitem(presets._handles, "verl", [])
    assert presets.nothing_patched("verl") == []

    class AgentLoopWorker:  # a version without the method the preset looks for
        pass

    fake_module(
        monkeypatch, "verl.experimental.agent_loop.agent_loop", AgentLoopWorker=AgentLoopWorker
    )
    assert presets.nothing_patched("verl") == ["verl.experimental.agent_loop.agent_loop"]
    presets._armed["verl"] = Options()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        presets._say_if_nothing_patched()
    messages = [str(w.message) for w in got if "patched nothing" in str(w.message)]
    assert len(messages) == 1 and "verl.experimental.agent_loop.agent_loop" in messages[0]


def test_registry_knows_verl_0_9_and_mindspeed_rl_names() -> None:
    from mstx_marks.analysis.model.coverage import EXPECTATIONS
    from mstx_marks.base import phases

    assert {
        name: phases.canonical(name)
        for name in (
            "wait_for_enough_samples", "timing_s/param_sync", "sync_rollout_weights",
            "rollouter/validate_time", "generate_async", "forward_backward",
            "Actor.compute_log_prob", "ActorRolloutHybrid.compute_log_prob",
            "Actor.update_actor", "ActorRolloutHybrid.update_actor", "Critic.compute_values",
            "Critic.update_critic", "Reference.compute_log_prob",
            "BaseWorker.dispatch_transfer_dock_data", "BaseWorker.collect_transfer_dock_data",
            "MegatronShardingManager.enter_infer_mode", "MegatronShardingManager.exit_infer_mode",
            "MegatronShardingManager.enter_train_mode", "MegatronShardingManager.exit_train_mode",
            "MegatronOffLoader.offload_param", "MegatronOffLoader.onload_optimizer",
        )
    } == {
        "wait_for_enough_samples": "wait_for_enough_samples",
        "timing_s/param_sync": "update_weights",
        "sync_rollout_weights": "update_weights",
        "rollouter/validate_time": "testing",
        "generate_async": "generate_async",
        "forward_backward": "forward_backward",
        "Actor.compute_log_prob": "compute_log_prob",
        "ActorRolloutHybrid.compute_log_prob": "compute_log_prob",
        "Actor.update_actor": "update_actor",
        "ActorRolloutHybrid.update_actor": "update_actor",
        "Critic.compute_values": "compute_values",
        "Critic.update_critic": "update_critic",
        "Reference.compute_log_prob": "compute_ref_log_prob",
        "BaseWorker.dispatch_transfer_dock_data": "transfer_dock_dispatch",
        "BaseWorker.collect_transfer_dock_data": "transfer_dock_collect",
        "MegatronShardingManager.enter_infer_mode": "resharding_to_infer",
        "MegatronShardingManager.exit_infer_mode": "resharding_to_infer",
        "MegatronShardingManager.enter_train_mode": "resharding_to_train",
        "MegatronShardingManager.exit_train_mode": "resharding_to_train",
        "MegatronOffLoader.offload_param": "offload",
        "MegatronOffLoader.onload_optimizer": "onload",
    }  # fmt: skip
    assert phases.COMPUTE_SCORE.emitted == "preset"
    # What verl 0.7.1-0.9.1 emit with the preset: the reward is the per-trajectory score.
    assert "compute_score" in EXPECTATIONS["verl-grpo"]
    assert "reward" not in EXPECTATIONS["verl-grpo"]
    verl_rows = {t.phase for t in presets.targets("verl")}
    assert {"compute_score", "compute_rm_score", "generate_sequences"} <= verl_rows
    from mstx_marks.capture.presets.verl import TRAINER_MODULES

    assert "verl.trainer.main_ppo_sync" in TRAINER_MODULES
