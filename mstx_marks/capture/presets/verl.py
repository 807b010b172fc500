"""verl's preset: the workers' stages, the agent loop, the trainer's timers.

Where the work runs, by version (read from the published wheels 0.6.1, 0.7.1, 0.9.0, 0.9.1):

- <= 0.7: ``verl.workers.fsdp_workers`` / ``megatron_workers`` ``ActorRolloutRefWorker``
  (``generate_sequences``, ``compute_log_prob``, ``compute_ref_log_prob``, ``update_actor``),
  ``CriticWorker`` (``compute_values``, ``update_critic``), and up to 0.7.0
  ``RewardModelWorker.compute_rm_score``;
- 0.7.1 and newer: ``verl.workers.engine_workers`` ``ActorRolloutRefWorker`` (the same three
  stages, no ``generate_sequences``) and ``TrainingWorker`` (``train_batch`` once per mini-batch,
  ``train_mini_batch``, ``infer_batch``; the critic is a plain ``TrainingWorker``);
- the agent loop's ``AgentLoopWorker.generate_sequences`` (async; ``AgentLoopWorkerBase`` in
  0.6.x, where the module attribute is a Ray actor class). The v1 trainer's
  ``AgentLoopWorkerTQ`` (0.8.0 ``trainer/main_ppo_sync.py``, 0.9.x
  ``trainer/ppo/v1/agent_loop_tq.py``) overrides it; like every subclass that overrides a
  patched method it is patched too (:func:`~mstx_marks.capture.presets.target.patch_target`),
  also in the actor, where Ray rebuilds that ``@ray.remote`` class by value. Its
  ``generate_sequences`` only spawns one task per prompt (``self.background_tasks``) and
  returns: the range ends when the last of those tasks is done (:func:`until_background_tasks`);
- the reward, 0.7.1 and newer: ``RewardLoopWorker.compute_score`` (async, in the reward-loop
  actor), one ``compute_score`` range per trajectory; the calls of one actor overlap on its
  event loop, each range ends once. This is where a function reward runs: the agent loop
  streams each finished trajectory there while the rollout goes on, and the v1 trainer has no
  ``reward`` timer then (the legacy one times a near-empty block). A reward model without its
  own resource pool is scored from the trainer: ``RewardLoopManager.compute_rm_score``. (The
  old ``verl.workers.reward_manager`` classes still ship but no trainer calls them, and
  ``compute_reward``/``compute_reward_async`` are gone since 0.7.1.)
- weight sync, 0.7.1 and newer, each side in the process where it runs: the actor's
  ``ActorRolloutRefWorker.update_weights`` (gather and send through the checkpoint engine, or
  load into the colocated rollout), the rollout's ``CheckpointEngineWorker.update_weights``
  (receive and load into the engine: seconds the first time), and the rollout server's
  ``abort_all_requests`` / ``resume_generation`` around it (vLLM's and SGLang's servers). The
  trainer's ``update_weights`` / ``sync_rollout_weights`` timer holds them all;
- the trainers' ``marked_timer`` (``step``, ``gen``, ``reward``, ``old_log_prob``, ...), bound
  as a global in each trainer module: routed through
  :func:`mstx_marks.profiling.verl_config.marked_timer`.
- the trainers' metrics logger, ``verl.utils.tracking.Tracking.log`` (and ``finish``): no
  range; each step's live figures go with its calls when :mod:`mstx_marks.live` is armed
  (:mod:`mstx_marks.capture.live_slot`).

**Inside verl's profiler window.** A stage method is ``register(DistProfiler.annotate(f))``. In
discrete mode the annotation starts a new profiler inside the call, so a range wrapped around the
class attribute would open before that profiler and be lost (MSTX id 0). The preset wraps ``f``
itself, replacing the function that ``DistProfiler.annotate``'s wrapper holds in its closure: the
range then starts after verl's profiler started and ends before it stops. In continuous mode verl
emits its own range around an annotated stage while its profiler runs; the preset then emits none
(``Options.duplicate_verl`` asks for both).

``verl_modules`` (named on its own in ``MSTX_MARKS_INSTRUMENT``) hooks the actor's model with
:func:`mstx_marks.capture.nn_modules.instrument_modules` (depth 4: the model, its decoder layers,
their attention and MLP; FSDP wrappers seen through) once ``ActorRolloutRefWorker.init_model``
built it: ``self.actor.engine.module`` from 0.7.1 (a list of chunks under Megatron),
``actor_module_fsdp`` in the older ``fsdp_workers``. The reference model and the critic are not
hooked.

>>> [t.path for t in TARGETS if t.module == "verl.workers.engine_workers"][:2]
['ActorRolloutRefWorker.compute_log_prob', 'ActorRolloutRefWorker.compute_ref_log_prob']
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import MutableMapping
from typing import Any, Callable

from mstx_marks.capture.instrument import Instrumented, replace, replace_closure
from mstx_marks.capture.live_slot import patch_finish, patch_fit, patch_log
from mstx_marks.capture.nn_modules import hook_after
from mstx_marks.capture.presets.built import Built
from mstx_marks.capture.presets.declare import EntryPoint, Preset, Recipe, RecipeTarget
from mstx_marks.capture.presets.target import Options, Target, wrap_calls
from mstx_marks.core.engine import rewrap
from mstx_marks.core.ranges import Range, Timed, mark

__all__ = ["BUILT", "ORDER", "PRESETS", "RECIPES", "TARGETS"]

ORDER = 1
PRESETS = (
    Preset(
        "verl",
        ("verl",),
        # verl (0.9.0+) only imports it, while verl/__init__ is still running: the import does
        # the work (and the patches wait for their modules).
        entry_points=(EntryPoint("verl.plugins", call=False),),
        where="<= 0.7: `fsdp_workers`/`megatron_workers` `ActorRolloutRefWorker`, `CriticWorker`;"
        " 0.7.1+: `engine_workers` `ActorRolloutRefWorker`, `TrainingWorker` (`train_batch`,"
        " `train_mini_batch`, `infer_batch`); the agent loop; every trainer module's"
        " `marked_timer`; verl's `Tracking.log` and the trainers' `fit` (no range: each step's"
        " live figures, `mstx/...`)",
        ranges="`compute_log_prob`, `compute_ref_log_prob`, `update_actor`, ..., and the trainer's"
        " timers (`step`, `gen`, `reward`, `old_log_prob`, `adv`, ...)",
    ),
    Preset(
        "verl_modules",
        ("verl",),
        on_its_own=True,
        where="the actor's model, once `ActorRolloutRefWorker.init_model` built it",
        ranges="a range per module call, named by its class (domain `Module`), to depth 4: the"
        " model, its decoder layers, their attention and MLP",
    ),
)

_ANNOTATE_VARS = {"func", "kwargs_outer"}


def _annotation_wrapper(stored: Any) -> Callable[..., Any] | None:
    """The ``DistProfiler.annotate`` wrapper in a stored method's ``__wrapped__`` chain."""
    f = getattr(stored, "__func__", stored)
    seen = 0
    while f is not None and seen < 16:  # register -> tqbridge -> annotate -> routing flag -> f
        code = getattr(f, "__code__", None)
        if code is not None:
            qualname = getattr(code, "co_qualname", "")  # Python 3.11+
            if (qualname.startswith("DistProfiler.annotate.") or not qualname) and (
                code.co_name == "wrapper" and set(code.co_freevars) >= _ANNOTATE_VARS
            ):
                return f  # type: ignore[no-any-return]
        f = getattr(f, "__wrapped__", None)
        seen += 1
    return None


def _verl_emits_its_own(worker: Any) -> bool:
    """Whether verl's own profiler emits a range around this call (continuous mode, enabled,
    this step and this rank): the same checks ``DistProfiler.annotate`` makes."""
    profiler = getattr(worker, "profiler", None)
    if profiler is None:
        return False
    try:
        active = profiler.check_enable() and profiler.check_this_step()
        active = active and profiler.check_this_rank()
        impl = getattr(profiler, "_impl", None)
        return bool(active and hasattr(impl, "annotate") and not getattr(impl, "discrete", True))
    except Exception:  # another verl's profiler API: emit ours
        return False


def inside_annotation(owner: Any, attr: str, target: Target, options: Options) -> Instrumented:
    """Wrap the function inside verl's ``DistProfiler.annotate`` (see the module docstring);
    a method with no annotation in this version is wrapped as a whole."""
    wrapper = _annotation_wrapper(vars(owner).get(attr, getattr(owner, attr)))
    if wrapper is None:
        return wrap_calls(owner, attr, target, options)
    site = options.site(target.phase, target.domain)

    def wrap(stage: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(stage) or inspect.isgeneratorfunction(stage):
            return site.wrap(stage)

        # functools.wraps keeps __name__: up to verl 0.9.0 it is the marker text verl emits.
        @functools.wraps(stage)
        def in_window(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not options.duplicate_verl and _verl_emits_its_own(self):
                return stage(self, *args, **kwargs)
            with site:
                return stage(self, *args, **kwargs)

        return in_window

    return replace_closure(wrapper, "func", wrap, f"{target.module}:{target.path}")


def _end_after(span: Range, tasks: list[Any]) -> None:
    """End ``span`` when the last of ``tasks`` (asyncio tasks) is done; now if there are none."""
    if not tasks:
        span.end()
        return
    left = [len(tasks)]

    def one_done(task: Any) -> None:
        left[0] -= 1
        if left[0] == 0:
            span.end()

    for task in tasks:
        task.add_done_callback(one_done)


def until_background_tasks(owner: Any, attr: str, target: Target, options: Options) -> Instrumented:
    """Each call is one range, ended when the call returns or, if the call added tasks to
    ``self.background_tasks`` (verl's ``AgentLoopWorkerTQ.generate_sequences`` spawns one per
    prompt and returns at once), when the last of those tasks is done. The wrapper of a
    coroutine function is one (Ray serves an actor with async methods on an event loop); it
    holds only the original and the range site, so Ray can ship it by value.

    >>> import asyncio
    >>> from mstx_marks import configure, default_recorder
    >>> configure(backend="record")
    >>> default_recorder().clear()
    >>> class Worker:
    ...     def __init__(self):
    ...         self.background_tasks, self.log = set(), []
    ...     async def generate_sequences(self, n):
    ...         for i in range(n):
    ...             task = asyncio.ensure_future(self.run(i))
    ...             self.background_tasks.add(task)
    ...             task.add_done_callback(self.background_tasks.discard)
    ...     async def run(self, i):
    ...         await asyncio.sleep(0.01 * i)
    >>> t = Target("verl", __name__, "Worker.generate_sequences", "generate_sequences", "any")
    >>> handle = until_background_tasks(Worker, "generate_sequences", t, Options())
    >>> async def main():
    ...     w = Worker()
    ...     await w.generate_sequences(3)
    ...     print([r.open for r in default_recorder().records()])  # the tasks still run
    ...     await asyncio.sleep(0.1)
    ...     print([r.open for r in default_recorder().records()])
    >>> asyncio.run(main())
    [True]
    [False]
    >>> handle.undo()
    """
    site = options.site(target.phase, target.domain)

    def wrap(o: object, a: str, raw: Any) -> Any:
        if not inspect.iscoroutinefunction(raw):
            return rewrap(raw, site.wrap)

        @functools.wraps(raw)
        async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            tasks = getattr(self, "background_tasks", None)
            before = set(tasks) if isinstance(tasks, (set, dict)) else None
            span = site.start()
            try:
                result = await raw(self, *args, **kwargs)
            except BaseException:
                span.end()
                raise
            # No await between the spawning and here: none of the new tasks is done yet.
            new = [] if before is None else [t for t in list(tasks or ()) if t not in before]
            _end_after(span, new)
            return result

        return call

    return replace(owner, attr, wrap)


def marked_timer(
    name: str, timing_raw: MutableMapping[str, float], *args: object, **kwargs: object
) -> Timed:
    """A drop-in for verl's ``marked_timer``: the block's seconds go to ``timing_raw[name]`` and
    the block is a range named ``name``; unlike verl's, both happen when the block raises too.
    verl's color/domain arguments are accepted and ignored (verl's NPU timer warns on them).

    >>> timing_raw = {}
    >>> with marked_timer("gen", timing_raw, color="red"):
    ...     pass
    >>> timing_raw["gen"] >= 0
    True
    """
    return mark(name, timing=timing_raw)


def route_timer(owner: Any, attr: str, target: Target, options: Options) -> Instrumented:
    """Replace a trainer module's ``marked_timer`` global by ours: the same timing dict, a range
    per block (ended on exceptions too), and no second range from verl's own timer."""

    def ours(module: object, name: str, raw: Any) -> Any:
        @functools.wraps(raw)
        def timer(timer_name: str, timing_raw: dict[str, float], *args: Any, **kwargs: Any) -> Any:
            return marked_timer(timer_name, timing_raw)

        return timer

    return replace(owner, attr, ours)


def _actor_model(worker: Any) -> Any:
    """The actor's model(s) of an ``ActorRolloutRefWorker`` (None when it has no actor)."""
    actor = getattr(worker, "actor", None)
    engine = getattr(actor, "engine", None)
    if engine is not None:
        return getattr(engine, "module", None)
    return getattr(worker, "actor_module_fsdp", None)


_ACTOR_MODEL = hook_after(_actor_model, depth=4)

_ENGINE = "verl.workers.engine_workers"
_AGENT = "verl.experimental.agent_loop.agent_loop"
_REWARD = "verl.experimental.reward_loop.reward_loop"
_NEW = "0.7.1 and newer"
#: verl's rollout servers (Ray actors in front of the engine): they pause it for a weight sync.
_SERVERS = (
    ("verl.workers.rollout.vllm_rollout.vllm_async_server", "vLLMHttpServer"),
    ("verl.workers.rollout.sglang_rollout.async_sglang_server", "SGLangHttpServer"),
)
_OLD = "0.7 and older"


_LEGACY = ("verl.workers.fsdp_workers", "verl.workers.megatron_workers")


def _legacy() -> list[Target]:
    rows = []
    for module in _LEGACY:
        for path, phase in [
            ("ActorRolloutRefWorker.generate_sequences", "generate_sequences"),
            ("ActorRolloutRefWorker.compute_log_prob", "compute_log_prob"),
            ("ActorRolloutRefWorker.compute_ref_log_prob", "compute_ref_log_prob"),
            ("ActorRolloutRefWorker.update_actor", "update_actor"),
            ("CriticWorker.compute_values", "compute_values"),
            ("CriticWorker.update_critic", "update_critic"),
        ]:
            rows.append(Target("verl", module, path, phase, _OLD, inside_annotation))
    return rows


#: verl's metrics logger (every trainer builds one), and what its rows emit: no range, the
#: step figures of :mod:`mstx_marks.live` in its log calls.
_TRACKING = "verl.utils.tracking"
LIVE_FIGURES = "(live figures)"
#: verl's trainer modules that bind ``marked_timer`` as a global (0.6.1 to 0.9.1).
TRAINER_MODULES = (
    "verl.trainer.ppo.ray_trainer",
    "verl.trainer.main_ppo_sync",  # 0.8.0 only
    "verl.trainer.ppo.v1.trainer_base",
    "verl.trainer.ppo.v1.trainer_sync",
    "verl.trainer.ppo.v1.trainer_colocate_async",
    "verl.trainer.ppo.v1.trainer_separate_async",
    "verl.experimental.fully_async_policy.fully_async_trainer",
    "verl.experimental.fully_async_policy.fully_async_rollouter",
    "verl.experimental.one_step_off_policy.ray_trainer",
    "verl.experimental.separation.ray_trainer",
)

TARGETS: tuple[Target, ...] = (
    Target("verl", _ENGINE, "ActorRolloutRefWorker.compute_log_prob", "compute_log_prob", _NEW,
           inside_annotation),
    Target("verl", _ENGINE, "ActorRolloutRefWorker.compute_ref_log_prob", "compute_ref_log_prob",
           _NEW, inside_annotation),
    Target("verl", _ENGINE, "ActorRolloutRefWorker.update_actor", "update_actor", _NEW,
           inside_annotation),
    Target("verl", _ENGINE, "TrainingWorker.train_batch", "train_batch", "0.8.0 and newer",
           inside_annotation),
    Target("verl", _ENGINE, "TrainingWorker.train_mini_batch", "train_mini_batch", _NEW),
    Target("verl", _ENGINE, "TrainingWorker.infer_batch", "infer_batch", _NEW),
    *_legacy(),
    Target("verl", "verl.workers.fsdp_workers", "RewardModelWorker.compute_rm_score",
           "compute_rm_score", "0.7.0 and older", inside_annotation),
    # Weight sync, each side in its own process (phases.ACTOR_SEND_WEIGHTS and the rest).
    Target("verl", _ENGINE, "ActorRolloutRefWorker.update_weights", "actor_send_weights", _NEW),
    Target("verl", "verl.checkpoint_engine.base", "CheckpointEngineWorker.update_weights",
           "rollout_receive_weights", _NEW),
    *(Target("verl", module, f"{server}.{method}", phase, _NEW)
      for module, server in _SERVERS
      for method, phase in (("abort_all_requests", "rollout_pause"),
                            ("resume_generation", "rollout_resume"))),
    # 0.9.1's vLLM replica resumes its servers' engines, then opens their gates, itself.
    Target("verl", _SERVERS[0][0], f"{_SERVERS[0][1]}.resume_engine_generation",
           "rollout_resume", "0.9.1 and newer"),
    Target("verl", _AGENT, "AgentLoopWorker.generate_sequences", "generate_sequences",
           "0.7 and newer", until_background_tasks),
    Target("verl", _REWARD, "RewardLoopWorker.compute_score", "compute_score", _NEW),
    Target("verl", _REWARD, "RewardLoopManager.compute_rm_score", "compute_rm_score", _NEW),
    Target("verl", _AGENT, "AgentLoopWorkerBase.generate_sequences", "generate_sequences",
           "0.6.x"),
    *(Target("verl", m, "marked_timer", "(timer names)", "0.6 and newer", route_timer)
      for m in TRAINER_MODULES),
    # The trainer's logger: each step's live figures go with its calls (mstx_marks.live).
    Target("verl", _TRACKING, "Tracking.log", LIVE_FIGURES, "0.6 and newer", patch_log),
    Target("verl", _TRACKING, "Tracking.finish", LIVE_FIGURES, "0.6 and newer", patch_finish),
    # ... and the trainers whose logger is never closed: the last step's at the end of fit.
    Target("verl", "verl.trainer.ppo.ray_trainer", "RayPPOTrainer.fit", LIVE_FIGURES,
           "0.6 and newer", patch_fit),
    Target("verl", "verl.trainer.ppo.v1.trainer_base", "PPOTrainer.fit", LIVE_FIGURES,
           "0.9.0 and newer", patch_fit),
    Target("verl_modules", _ENGINE, "ActorRolloutRefWorker.init_model", "module_forward", _NEW,
           _ACTOR_MODEL),
    Target("verl_modules", "verl.workers.fsdp_workers", "ActorRolloutRefWorker.init_model",
           "module_forward", _OLD, _ACTOR_MODEL),
)  # fmt: skip
#: Every verl worker a Ray actor runs derives from ``Worker`` and calls its ``__init__``: the
#: stage methods its class has must be the ones the rows above wrap.
BUILT = (
    Built(
        "verl",
        "verl.single_controller.base.worker",
        "Worker.__init__",
        tuple(
            sorted(
                {
                    t.path.rpartition(".")[2]
                    for t in TARGETS
                    if t.framework == "verl" and t.phase != LIVE_FIGURES
                }
                - {"marked_timer"}
            )
        ),
    ),
)


# --- the profiler recipes of verl's workers (mstx_marks.profiling.recipes) -------------------

_FSDP = "verl.workers.engine.fsdp.transformer_impl"
_MCORE = "verl.workers.engine.megatron.transformer_impl"
_DP_ACTOR = "verl.workers.actor.dp_actor"
_DP_CRITIC = "verl.workers.critic.dp_critic"
_MEGATRON_ACTOR = "verl.workers.actor.megatron_actor"

#: The worker calls that are one verl step each (what ``steps=`` counts), and whose worker holds
#: verl's profiler (what the global-profiler warning checks).
_STAGES = (
    RecipeTarget(_ENGINE, "TrainingWorker.train_mini_batch", "stage", "verl"),
    RecipeTarget(_ENGINE, "TrainingWorker.infer_batch", "stage", "verl"),
    *(
        RecipeTarget(module, f"{cls}.{method}", "stage", "verl")
        for module in _LEGACY
        for cls, method in (
            ("ActorRolloutRefWorker", "update_actor"),
            ("ActorRolloutRefWorker", "compute_log_prob"),
            ("ActorRolloutRefWorker", "compute_ref_log_prob"),
            ("CriticWorker", "update_critic"),
        )
    ),
)
#: verl <= 0.7's legacy Megatron actor runs its micro-batches where no patch reaches.
_NOT_THE_LEGACY_MEGATRON_ACTOR = ((_MEGATRON_ACTOR, "megatron_actor"),)


def _micro_batch_targets(legacy_loop: str) -> tuple[RecipeTarget, ...]:
    """The engines' micro-batch loops (forward_backward_batch) and their forward_step."""
    dp_loops = [RecipeTarget(_DP_ACTOR, f"DataParallelPPOActor.{legacy_loop}", "loop",
                             "legacy_fsdp")]  # fmt: skip
    dp_steps = [
        RecipeTarget(_DP_ACTOR, "DataParallelPPOActor._forward_micro_batch", "iteration",
                     "legacy_fsdp", "next"),
    ]  # fmt: skip
    if legacy_loop == "update_policy":
        dp_loops.append(RecipeTarget(_DP_CRITIC, "DataParallelPPOCritic.update_critic", "loop",
                                     "legacy_fsdp"))  # fmt: skip
        dp_steps.append(RecipeTarget(_DP_CRITIC, "DataParallelPPOCritic._forward_micro_batch",
                                     "iteration", "legacy_fsdp", "next"))  # fmt: skip
    return (
        RecipeTarget(_FSDP, "FSDPEngine.forward_backward_batch", "loop", "fsdp"),
        RecipeTarget(_FSDP, "FSDPEngineWithLMHead.forward_step", "iteration", "fsdp", "next"),
        RecipeTarget(_MCORE, "MegatronEngine.forward_backward_batch", "loop", "megatron"),
        RecipeTarget(_MCORE, "MegatronEngineWithLMHead.forward_step", "iteration", "megatron",
                     "next"),
        RecipeTarget(_MCORE, "MegatronEngineWithValueHead.forward_step", "iteration",
                     "megatron", "next"),
        *dp_loops,
        *dp_steps,
    )  # fmt: skip


_LOG_PROB_FRAMEWORKS = (
    "verl 0.8-0.9.1 FSDP and Megatron engines (engine_workers); verl <= 0.7 legacy fsdp_workers"
    " (dp_actor). Not on verl <= 0.7's legacy Megatron actor (megatron-core runs its micro-batches"
    " through a local closure): a warning says so"
)

RECIPES: tuple[Recipe, ...] = (
    Recipe(
        "ref_log_prob_micro_batch",
        _micro_batch_targets("compute_log_prob"),
        "each forward-only micro-batch of the reference model, a window per compute_ref_log_prob",
        "verl transformer_impl.py: a torch_npu profiler in forward_backward_batch around its"
        " micro-batch loop, step() at the end of each micro-batch, role Ref",
        _LOG_PROB_FRAMEWORKS,
        "Ref_compute_log_prob",
        ("ref",),
        True,
        _STAGES,
        _NOT_THE_LEGACY_MEGATRON_ACTOR,
    ),
    Recipe(
        "actor_log_prob_micro_batch",
        _micro_batch_targets("compute_log_prob"),
        "each forward-only micro-batch of the actor's compute_log_prob, a window per call",
        "verl transformer_impl.py: a torch_npu profiler in forward_backward_batch around its"
        " micro-batch loop, step() at the end of each micro-batch, role Actor",
        _LOG_PROB_FRAMEWORKS,
        "Actor_compute_log_prob",
        ("actor",),
        True,
        _STAGES,
        _NOT_THE_LEGACY_MEGATRON_ACTOR,
    ),
    Recipe(
        "update_mini_batch",
        (
            RecipeTarget(_ENGINE, "TrainingWorker.train_mini_batch", "loop", "verl"),
            RecipeTarget(_ENGINE, "TrainingWorker.train_batch", "iteration", "verl"),
            RecipeTarget(_DP_ACTOR, "DataParallelPPOActor.update_policy", "loop", "legacy_fsdp"),
            RecipeTarget(_DP_ACTOR, "DataParallelPPOActor._optimizer_step", "iteration",
                         "legacy_fsdp"),
            RecipeTarget(_DP_CRITIC, "DataParallelPPOCritic.update_critic", "loop",
                         "legacy_fsdp"),
            RecipeTarget(_DP_CRITIC, "DataParallelPPOCritic._optimizer_step", "iteration",
                         "legacy_fsdp"),
            RecipeTarget(_MEGATRON_ACTOR, "MegatronPPOActor.update_policy", "loop",
                         "legacy_megatron"),
            RecipeTarget(_MEGATRON_ACTOR, "MegatronPPOActor.forward_backward_batch", "iteration",
                         "legacy_megatron", "next"),
        ),
        "each mini-batch (forward, backward and optimizer step) of one update, a window per"
        " update (actor or critic)",
        "verl engine_workers.py: a torch_npu profiler in TrainingWorker.train_mini_batch, step()"
        " after each mini-batch; legacy: in dp_actor / megatron_actor update_policy",
        "verl 0.8-0.9.1 FSDP and Megatron engines; verl <= 0.7 legacy dp_actor, dp_critic and"
        " megatron_actor (update_policy)",
        "{backend}_{role}_update_profile",
        ("actor", "critic"),
        stages=_STAGES,
    ),
    Recipe(
        "update_micro_batch",
        _micro_batch_targets("update_policy"),
        "each training micro-batch, its forward and backward (the last one also the optimizer"
        " step on legacy workers), a window per forward_backward_batch call",
        "verl transformer_impl.py: a torch_npu profiler in forward_backward_batch around its"
        " micro-batch loop in training mode, step() at the end of each micro-batch",
        "verl 0.8-0.9.1 FSDP engine, Megatron engine without pipeline parallel; verl <= 0.7"
        " legacy dp_actor / dp_critic. Not with Megatron pipeline parallel (1F1B interleaves"
        " micro-batches) nor verl <= 0.7's legacy Megatron actor: a warning says so; use"
        " update_mini_batch",
        "{backend}_{role}_update_micro_batch",
        ("actor", "critic"),
        False,
        _STAGES,
        _NOT_THE_LEGACY_MEGATRON_ACTOR,
    ),
)  # fmt: skip
