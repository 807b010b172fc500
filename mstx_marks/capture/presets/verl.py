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
from mstx_marks.capture.nn_modules import hook_after
from mstx_marks.capture.presets.built import Built
from mstx_marks.capture.presets.target import Options, Target, wrap_calls
from mstx_marks.core.engine import rewrap
from mstx_marks.core.ranges import Range, Timed, mark

__all__ = ["BUILT", "TARGETS"]

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


def _legacy() -> list[Target]:
    rows = []
    for backend in ("fsdp_workers", "megatron_workers"):
        module = f"verl.workers.{backend}"
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
                {t.path.rpartition(".")[2] for t in TARGETS if t.framework == "verl"}
                - {"marked_timer"}
            )
        ),
    ),
)
