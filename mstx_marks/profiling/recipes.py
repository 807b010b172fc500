"""Profiler recipes: the seed guide's scheduled captures, without editing framework source.

The Ascend RL profiling guide (进阶指南, 精细化采集) has users hand-edit verl, vLLM, vllm-ascend or
SGLang: build a ``torch_npu.profiler.profile`` with a ``schedule`` in the function that runs one
loop, ``start()`` it, ``step()`` it at the end of each iteration and ``stop()`` it after the loop.
Each such edit is a named recipe here, with the guide's semantics:

- **a window per call of the loop's function**: the schedule starts anew in every call (every
  PPO step's ``forward_backward_batch`` / ``train_mini_batch`` gets its window); the decode-step
  recipe, whose profiler the guide builds in the worker's ``__init__``, runs once per process;
- **a step at the end of each iteration**: a micro-batch's window holds its forward AND its
  backward (the profiler steps when the next micro-batch starts and when the loop returns), a
  mini-batch's window its optimizer step;
- ``steps=[2,4]`` limits a verl recipe to those global steps (verl's count, as
  ``global_profiler.steps``: the n-th call of the stage in a worker is step n, which is verl's
  step when the job did not resume from a checkpoint) and ``role=`` to actor, critic or ref.

Arming waits for the framework module to be imported (it never imports it) and patches the calls
(:mod:`mstx_marks.profiling.windows`, the engine ``capture_steps`` runs on too). The profiler has
the guide's options (CPU and device activity, level1, db export, analyse on) with MSTX on, which
the guide's own ``_ExperimentalConfig(Level1, Db)`` leaves off. Each window is one trace folder
run (torch_npu makes one ``*_ascend_pt`` folder per profiler) under ``<out>/<folder>``, the
guide's folder names: ``vllm_profile``, ``sglang_profile``, ``Ref_compute_log_prob``,
``Actor_compute_log_prob``, ``{fsdp,megatron}_{actor,critic}_update_profile``,
``{fsdp,megatron}_{actor,critic}_update_micro_batch``, ``vllm_offline_profile``; ``<out>`` is
``out=``, else ``MSTX_MARKS_OUT``, else ``./outputs``.

From the environment, in every process of a job (several recipes separated by ``;``)::

    MSTX_MARKS_CAPTURE="update_micro_batch:wait=1,warmup=1,active=2,steps=[2,4],role=actor"

The same from Python:

>>> handle = capture("rollout_decode", wait=29, warmup=1, active=30)
>>> handle.total, handle.done
(60, False)
>>> handle.undo()
>>> handle.done
True

Annotation never breaks the workload: the wrapped call always runs and its exceptions pass
through untouched (the step still counts); a profiler that fails to build, start or step warns
once and the recipe disarms itself. ``python -m mstx_marks recipes`` prints :func:`recipes_table`.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import sys
import threading
import weakref
from collections.abc import Sequence
from types import ModuleType, TracebackType
from typing import Any, NamedTuple, Optional, Union

from mstx_marks.base import env
from mstx_marks.base.checks import check_bool, check_int, check_ints
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.forking import new_lock
from mstx_marks.base.import_hooks import when_imported
from mstx_marks.profiling.profiler import experimental_config
from mstx_marks.profiling.windows import Hook, Schedule, Site, Stepper, hook_into

__all__ = [
    "DEFAULT_OUT",
    "RECIPES",
    "Capture",
    "Recipe",
    "Target",
    "arm_from_text",
    "armed",
    "capture",
    "recipes_table",
]

#: Where traces go when neither ``out=`` nor ``MSTX_MARKS_OUT`` says (the guide's ./outputs).
DEFAULT_OUT = "outputs"

_VERL_WARNING = (
    "verl's global profiler is on; the guide says to turn it off (global_profiler.steps=null)"
    " while a recipe captures"
)
ROLES = ("actor", "critic", "ref")


class Target(NamedTuple):
    """One patched call: ``kind`` loop (a new window per call), iteration (one step) or stage
    (one verl step of its worker: what ``steps=`` counts)."""

    module: str
    path: str
    kind: str
    #: What runs there: vllm, sglang, fsdp, megatron, legacy_fsdp, legacy_megatron, verl.
    tag: str
    #: For iterations: step "after" the call, or at the "next" iteration and the loop's end.
    boundary: str = "after"


class Recipe(NamedTuple):
    """One profiler recipe: the calls it patches, what a step is, what it replaces."""

    #: The recipe's name (``MSTX_MARKS_CAPTURE="NAME:..."``, ``capture(NAME)``).
    name: str
    targets: tuple[Target, ...]
    #: Which calls count as a step.
    step: str
    #: The hand edit of the guide it replaces (one line).
    replaces: str
    #: Frameworks and versions the targets were checked in; where it cannot attach.
    frameworks: str
    #: The trace folder under ``<out>``: ``{tag}``, ``{role}``, ``{Role}``, ``{backend}``.
    folder: str
    #: The roles whose loops it captures (verl recipes); empty: any process.
    roles: tuple[str, ...] = ()
    #: For verl engine loops: the ``forward_only`` the loop call must have.
    forward_only: Optional[bool] = None


_FSDP = "verl.workers.engine.fsdp.transformer_impl"
_MCORE = "verl.workers.engine.megatron.transformer_impl"
_WORKERS = "verl.workers.engine_workers"
_DP_ACTOR = "verl.workers.actor.dp_actor"
_DP_CRITIC = "verl.workers.critic.dp_critic"
_MEGATRON_ACTOR = "verl.workers.actor.megatron_actor"
_LEGACY = ("verl.workers.fsdp_workers", "verl.workers.megatron_workers")

#: The worker calls that are one verl step each (what ``steps=`` counts), and whose worker holds
#: verl's profiler (what the global-profiler warning checks).
_STAGES = (
    Target(_WORKERS, "TrainingWorker.train_mini_batch", "stage", "verl"),
    Target(_WORKERS, "TrainingWorker.infer_batch", "stage", "verl"),
    *(
        Target(module, f"{cls}.{method}", "stage", "verl")
        for module in _LEGACY
        for cls, method in (
            ("ActorRolloutRefWorker", "update_actor"),
            ("ActorRolloutRefWorker", "compute_log_prob"),
            ("ActorRolloutRefWorker", "compute_ref_log_prob"),
            ("CriticWorker", "update_critic"),
        )
    ),
)


def _micro_batch_targets(legacy_loop: str) -> tuple[Target, ...]:
    """The engines' micro-batch loops (forward_backward_batch) and their forward_step."""
    dp_loops = [Target(_DP_ACTOR, f"DataParallelPPOActor.{legacy_loop}", "loop", "legacy_fsdp")]
    dp_steps = [
        Target(_DP_ACTOR, "DataParallelPPOActor._forward_micro_batch", "iteration", "legacy_fsdp",
               "next"),
    ]  # fmt: skip
    if legacy_loop == "update_policy":
        dp_loops.append(Target(_DP_CRITIC, "DataParallelPPOCritic.update_critic", "loop",
                               "legacy_fsdp"))  # fmt: skip
        dp_steps.append(Target(_DP_CRITIC, "DataParallelPPOCritic._forward_micro_batch",
                               "iteration", "legacy_fsdp", "next"))  # fmt: skip
    return (
        Target(_FSDP, "FSDPEngine.forward_backward_batch", "loop", "fsdp"),
        Target(_FSDP, "FSDPEngineWithLMHead.forward_step", "iteration", "fsdp", "next"),
        Target(_MCORE, "MegatronEngine.forward_backward_batch", "loop", "megatron"),
        Target(_MCORE, "MegatronEngineWithLMHead.forward_step", "iteration", "megatron", "next"),
        Target(_MCORE, "MegatronEngineWithValueHead.forward_step", "iteration", "megatron",
               "next"),
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
        "rollout_decode",
        (
            Target("vllm.v1.worker.gpu_worker", "Worker.execute_model", "iteration", "vllm"),
            Target("vllm_ascend.worker.worker_v1", "NPUWorker.execute_model", "iteration", "vllm"),
            Target("vllm_ascend.worker.worker", "NPUWorker.execute_model", "iteration", "vllm"),
            Target(
                "sglang.srt.model_executor.model_runner",
                "ModelRunner.forward",
                "iteration",
                "sglang",
            ),
        ),
        "every call (each engine step's model run, prefill and decode batches alike), once per"
        " engine process",
        "vllm-ascend worker: a torch_npu profiler built in NPUWorker.__init__, step() after each"
        " execute_model (SGLang: around ModelRunner.forward)",
        "vLLM 0.11-0.33 (CPUWorker inherits Worker.execute_model); vllm-ascend 0.11 (worker_v1)"
        " and 0.13+ (worker); SGLang 0.5",
        "{tag}_profile",
    ),
    Recipe(
        "vllm_offline_step",
        (
            Target("vllm.entrypoints.llm", "LLM._run_engine", "loop", "vllm"),
            Target("vllm.v1.engine.llm_engine", "LLMEngine.step", "iteration", "vllm"),
        ),
        "each llm_engine.step() of one LLM.generate/encode call (a window per call)",
        "vLLM offline: a torch_npu profiler around LLM._run_engine's while loop, step() after each"
        " llm_engine.step() (seed 'RL强化学习场景性能数据采集及分析指导' 5.1)",
        "vLLM 0.11-0.33 offline LLM (the front-end process)",
        "vllm_offline_profile",
    ),
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
    ),
    Recipe(
        "update_mini_batch",
        (
            Target(_WORKERS, "TrainingWorker.train_mini_batch", "loop", "verl"),
            Target(_WORKERS, "TrainingWorker.train_batch", "iteration", "verl"),
            Target(_DP_ACTOR, "DataParallelPPOActor.update_policy", "loop", "legacy_fsdp"),
            Target(_DP_ACTOR, "DataParallelPPOActor._optimizer_step", "iteration", "legacy_fsdp"),
            Target(_DP_CRITIC, "DataParallelPPOCritic.update_critic", "loop", "legacy_fsdp"),
            Target(_DP_CRITIC, "DataParallelPPOCritic._optimizer_step", "iteration", "legacy_fsdp"),
            Target(_MEGATRON_ACTOR, "MegatronPPOActor.update_policy", "loop", "legacy_megatron"),
            Target(
                _MEGATRON_ACTOR,
                "MegatronPPOActor.forward_backward_batch",
                "iteration",
                "legacy_megatron",
                "next",
            ),
        ),
        "each mini-batch (forward, backward and optimizer step) of one update, a window per"
        " update (actor or critic)",
        "verl engine_workers.py: a torch_npu profiler in TrainingWorker.train_mini_batch, step()"
        " after each mini-batch; legacy: in dp_actor / megatron_actor update_policy",
        "verl 0.8-0.9.1 FSDP and Megatron engines; verl <= 0.7 legacy dp_actor, dp_critic and"
        " megatron_actor (update_policy)",
        "{backend}_{role}_update_profile",
        ("actor", "critic"),
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
    ),
)

_BY_NAME: dict[str, Recipe] = {r.name: r for r in RECIPES}
_VERL_RECIPES = frozenset(r.name for r in RECIPES if r.frameworks.startswith("verl"))
_MICRO = frozenset({"ref_log_prob_micro_batch", "actor_log_prob_micro_batch", "update_micro_batch"})


# --- what a call is: role, backend, verl step ---------------------------------------------------

_ABSENT = object()


def _forward_only(args: tuple[Any, ...], kwargs: dict[str, Any], default: object = None) -> object:
    """``forward_only`` of ``forward_backward_batch(self, data, loss_function, forward_only)``."""
    if "forward_only" in kwargs:
        return kwargs["forward_only"]
    return args[3] if len(args) > 3 else default


def _is_ref(engine: object) -> bool:
    """verl's reference model: ``engine_config.forward_only`` True (0.9.1: the ref's ``optim``
    defaults to a non-empty config, so the guide's ``not self.optimizer_config`` is wrong); an
    engine without that flag is the reference when its ``optimizer`` (legacy actor:
    ``actor_optimizer``) is None."""
    flag = getattr(getattr(engine, "engine_config", None), "forward_only", None)
    if isinstance(flag, bool):
        return flag
    return any(getattr(engine, a, _ABSENT) is None for a in ("optimizer", "actor_optimizer"))


def _verl_role(obj: object) -> str:
    """actor, critic or ref: a verl engine, TrainingWorker, or legacy actor/critic."""
    config = getattr(obj, "config", None)
    engine = getattr(obj, "engine", None) if hasattr(obj, "engine") else obj
    name = type(obj).__name__ + " " + type(engine).__name__
    model_type = getattr(getattr(engine, "model_config", None), "model_type", None)
    if (
        "Critic" in name
        or "ValueHead" in name
        or "value_model"
        in (
            model_type,
            getattr(config, "model_type", None),
        )
    ):
        return "critic"
    return "ref" if _is_ref(engine) else "actor"


def _backend(obj: object, tag: str) -> str:
    engine = getattr(obj, "engine", obj)
    if tag.endswith("megatron") or "megatron" in type(engine).__module__:
        return "megatron"
    return "fsdp"


def _pipeline_size(engine: object) -> int:
    size = getattr(getattr(engine, "engine_config", None), "pipeline_model_parallel_size", 1)
    return size if isinstance(size, int) and not isinstance(size, bool) else 1


class _Stage(NamedTuple):
    worker: object
    step: int


#: The stage calls running, by the thread that entered them, innermost last. No contextvars
#: (the library's rule): each entry is its own token, so an exit finds its own entry by
#: identity, whatever ran in between (a generator exited late, another stage on the thread).
_stages: dict[int, list[_Stage]] = {}


def _running_stages() -> tuple[_Stage, ...]:
    return tuple(_stages.get(threading.get_ident(), ()))


_stage_counts: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()
_id_counts: dict[tuple[int, str], int] = {}  # objects that cannot be weakly referenced


def _count(obj: object, what: str) -> int:
    """The n-th call (from 1) of ``what`` on ``obj``."""
    try:
        counts = _stage_counts.setdefault(obj, {})
    except TypeError:
        key = (id(obj), what)
        _id_counts[key] = _id_counts.get(key, 0) + 1
        return _id_counts[key]
    counts[what] = counts.get(what, 0) + 1
    return counts[what]


class _StageHook(Hook):
    """Counts a worker's calls of one stage: the n-th is verl step n."""

    order = 0

    def __init__(self, what: str) -> None:
        self.what = what

    def enter(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not args:
            return None
        stage = _Stage(args[0], _count(args[0], self.what))
        tid = threading.get_ident()
        _stages.setdefault(tid, []).append(stage)
        return tid, stage

    def exit(self, token: Any, error: Optional[BaseException]) -> None:
        tid, stage = token
        running = _stages.get(tid, [])
        for i in range(len(running) - 1, -1, -1):
            if running[i] is stage:
                del running[i]
                break
        if not running:
            _stages.pop(tid, None)


_stage_hooks: dict[tuple[str, str], _StageHook] = {}
_stage_sites: list[tuple[Site, Hook]] = []


def _arm_stages() -> None:
    """Patch the stage calls once per process (they only count: cheap, never undone)."""
    for target in _STAGES:
        key = (target.module, target.path)
        if key not in _stage_hooks:
            _stage_hooks[key] = _StageHook(f"{target.module}:{target.path}")
            when_imported(target.module, functools.partial(_attach_stage, target))


def _attach_stage(target: Target, module: ModuleType) -> None:
    owner = _owner(module, target)
    if owner is not None:
        hook = _stage_hooks[(target.module, target.path)]
        _stage_sites.append((hook_into(owner, target.path.rpartition(".")[2], hook), hook))


def _owner(module: ModuleType, target: Target) -> Optional[type]:
    owner_name, _, attr = target.path.rpartition(".")
    owner = getattr(module, owner_name, None)
    if isinstance(owner, type) and callable(getattr(owner, attr, None)):
        return owner
    return None


def _verl_profiler_on(worker: object) -> bool:
    """Whether ``worker`` carries verl's DistProfiler (``self.profiler``) and it is enabled."""
    try:
        profiler = getattr(worker, "profiler", None)
        return profiler is not None and profiler.check_enable() is True
    except Exception:  # a probe must never break the workload
        return False


def _verl_version() -> str:
    try:
        from importlib.metadata import version

        return f"verl {version('verl')}"
    except Exception:
        return "verl (version unknown)"


# --- captures -----------------------------------------------------------------------------------

_lock = new_lock(reentrant=True)
#: The captures armed in this process and not done.
_armed: list[Capture] = []


class _Context(NamedTuple):
    """What one window is: its folder, and who runs it."""

    folder: str
    role: str
    step: Optional[int]
    workers: tuple[object, ...]


def _safe(word: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", word) or "python"


class Capture:
    """An armed recipe in this process: what :func:`capture` returns.

    ``counted`` is the iterations profiled so far (all windows), ``windows`` the windows
    opened, ``folders`` their trace folders (``save_path`` the newest, ``role`` its role),
    ``total`` one window's schedule length; ``done`` is True once the recipe was undone, its
    last chosen step passed, its one window (decode steps) ended, or it disarmed itself. Also a
    context manager that undoes on exit.
    """

    def __init__(self, recipe: Recipe, options: dict[str, Any]) -> None:
        self.recipe = recipe
        self.options = options
        self.wait: int = options["wait"]
        self.warmup: int = options["warmup"]
        self.active: int = options["active"]
        self.repeat: int = options["repeat"]
        self.skip_first: int = options["skip_first"]
        self.level: str = options["level"]
        self.export: Union[str, list[str]] = options["export"]
        self.out: str = options["out"]
        self.steps: tuple[int, ...] = options["steps"]
        self.role_filter: Optional[str] = options["role"]
        self.role: Optional[str] = None
        self.save_path: Optional[str] = None
        self.folders: list[str] = []
        schedule = Schedule(
            options["wait"], options["warmup"], options["active"], options["repeat"],
            options["skip_first"],
        )  # fmt: skip
        self.stepper = Stepper(
            schedule, self._build, name=f"recipe {recipe.name}",
            per_call=any(t.kind == "loop" for t in recipe.targets),
            loop_filter=self._loop_context, iteration_filter=self._iteration_context,
            on_done=self._forget,
        )  # fmt: skip
        self.total = self.stepper.total

    @property
    def done(self) -> bool:
        return self.stepper.done

    @property
    def counted(self) -> int:
        return sum(w.steps for w in self.stepper.windows)

    @property
    def windows(self) -> int:
        return len(self.stepper.windows)

    def _attach(self, target: Target, module: ModuleType) -> None:
        """Runs when ``target.module`` is imported: hook the call in."""
        if self.done:
            return
        owner = _owner(module, target)
        if owner is None:
            warn_once(
                ("recipe target", self.recipe.name, target.module, target.path),
                f"recipe {self.recipe.name}: {target.module} has no {target.path} (it is in"
                f" {self.recipe.frameworks}); nothing is captured there",
            )
            return
        attr = target.path.rpartition(".")[2]
        if target.kind == "loop":
            self.stepper.add_loop(owner, attr, target.tag)
        else:
            self.stepper.add_iteration(owner, attr, target.tag, target.boundary)

    def _loop_context(self, tag: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A loop call's window (None: this call is not captured)."""
        obj = args[0] if args else None
        if not self.recipe.roles:
            return self._context(self.recipe.folder.format(tag=tag), "", None, ())
        wanted = self.recipe.forward_only
        if (
            wanted is not None
            and tag in ("fsdp", "megatron")
            and (_forward_only(args, kwargs, False) is not wanted)
        ):
            return None
        role = _verl_role(obj)
        if role not in self.recipe.roles or self.role_filter not in (None, role):
            return None
        stages = _running_stages()
        step = stages[-1].step if stages else _count(obj, f"{self.recipe.name} loop")
        if self.steps and step not in self.steps:
            self._maybe_finish(step)
            return None
        backend = _backend(obj, tag)
        if self.recipe.name == "update_micro_batch" and not self._micro_ok(obj, backend):
            return None
        folder = self.recipe.folder.format(role=role, Role=role.capitalize(), backend=backend)
        return self._context(folder, role, step, (*(s.worker for s in stages), obj))

    def _micro_ok(self, engine: object, backend: str) -> bool:
        size = _pipeline_size(engine) if backend == "megatron" else 1
        if size > 1:
            warn_once(
                ("recipe pipeline", self.recipe.name),
                f"recipe {self.recipe.name}: verl's Megatron engine runs pipeline parallel"
                f" (size {size}), whose 1F1B schedule interleaves micro-batches inside"
                " megatron-core: no window holds one micro-batch's forward and backward, so"
                " nothing is captured; use update_mini_batch",
            )
        return size == 1

    def _maybe_finish(self, step: int) -> None:
        if step > max(self.steps):
            self.stepper.finish()  # every chosen step is behind: restore the methods

    def _iteration_context(
        self, tag: str, args: tuple[Any, ...], kwargs: dict[str, Any], context: Any
    ) -> Any:
        if context is not None:
            return context
        return self._context(self.recipe.folder.format(tag=tag), "", None, ())

    def _context(
        self, folder: str, role: str, step: Optional[int], workers: tuple[Any, ...]
    ) -> _Context:
        return _Context(os.path.join(self.out, _safe(folder)), role, step, workers)

    def _build(self, context: _Context) -> Any:
        """A window's profiler (the stepper builds it at the window's first iteration)."""
        if self.recipe.name in _VERL_RECIPES and any(map(_verl_profiler_on, context.workers)):
            warn_once(("recipe verl profiler", self.recipe.name), _VERL_WARNING)
        from mstx_marks.profiling import profiler

        o = self.options
        self.role, self.save_path = context.role or None, context.folder
        self.folders.append(context.folder)
        built = profiler.build_profiler(
            contents=self._contents(), level=o["level"], analysis=o["analyse"],
            export=o["export"], save_path=context.folder, wait=o["wait"], warmup=o["warmup"],
            active=o["active"], repeat=o["repeat"], skip_first=o["skip_first"],
        )  # fmt: skip
        if not o["analyse"]:
            _print_offline_line(self.recipe.name, context.folder)
        return built

    def _contents(self) -> tuple[str, ...]:
        o = self.options
        flags = (
            ("shapes", "record_shapes"),
            ("module", "with_modules"),
            ("memory", "profile_memory"),
        )
        extra = tuple(word for word, key in (*flags, ("stack", "with_stack")) if o[key])
        return ("npu", "cpu", *extra)

    def _forget(self) -> None:
        with _lock:
            if self in _armed:
                _armed.remove(self)

    def undo(self) -> None:
        """Disarm: stop the profiler if it runs (what it recorded is written), restore the
        patched methods. Any number of calls.

        >>> handle = capture("update_mini_batch", active=2)
        >>> handle.undo(); handle.undo()
        >>> handle.done, handle.counted
        (True, 0)
        """
        self.stepper.finish()

    def __enter__(self) -> Capture:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.undo()

    def __repr__(self) -> str:
        return (
            f"Capture({self.recipe.name!r}, wait={self.wait}, warmup={self.warmup},"
            f" active={self.active}, repeat={self.repeat}, windows={self.windows},"
            f" done={self.done})"
        )


_printed: set[str] = set()


def _print_offline_line(recipe: str, folder: str) -> None:
    """analyse=False: the data is written unparsed; say once per folder how to parse it."""
    if folder in _printed:
        return
    _printed.add(folder)
    print(
        f"mstx_marks: recipe {recipe} writes unparsed profiler data to {folder}; parse it"
        ' offline with: python -c "from torch_npu.profiler.profiler import analyse;'
        f" analyse(profiler_path='{folder}')\"",
        file=sys.stderr,
    )


def _cannot_attach(recipe: Recipe, what: str, module: ModuleType) -> None:
    """A framework the recipe cannot reach was imported: say so once, naming what to use."""
    warn_once(
        ("recipe cannot attach", recipe.name, what),
        f"recipe {recipe.name}: {_verl_version()}'s legacy Megatron actor ({what}) runs its"
        " micro-batches inside megatron-core's pipeline schedule through a local closure, which"
        " cannot be patched: nothing is captured there; use update_mini_batch, or verl's Megatron"
        " engine (verl >= 0.8, trainer.use_legacy_worker_impl=disable)",
    )


def _check_out(out: object) -> str:
    if out is None:
        out = env.text(env.OUT) or DEFAULT_OUT
    if isinstance(out, os.PathLike):
        out = os.fspath(out)
    if not isinstance(out, str):
        raise TypeError(f"out must be a str or a path, got {type(out).__name__} {out!r}")
    if not out.strip():
        raise ValueError(f"out must be a non-empty folder name, got {out!r}")
    return os.path.abspath(out)


def _check_options(recipe: Recipe, options: dict[str, Any]) -> dict[str, Any]:
    """Every option checked now: a wrong type is a TypeError, a bad value a ValueError."""
    o = dict(options)
    for key in ("wait", "warmup", "skip_first"):
        o[key] = check_int(o[key], key)
    o["active"] = check_int(o["active"], "active", 1)
    o["repeat"] = check_int(o["repeat"], "repeat", 1)
    for key in ("record_shapes", "with_modules", "profile_memory", "with_stack", "analyse"):
        o[key] = check_bool(o[key], key)
    export = o["export"]
    if not isinstance(export, str):
        o["export"] = list(export) if isinstance(export, Sequence) else export
    # What build_profiler checks later (level, export), now; mstx_supported: no torch_npu probe.
    experimental_config(o["level"], o["export"], mstx_supported=True)
    o["level"] = o["level"].lower()
    o["out"] = _check_out(o["out"])
    verl = recipe.name in _VERL_RECIPES
    steps = o["steps"]
    if steps is not None and not verl:
        raise ValueError(
            f"steps applies to the verl recipes only: {recipe.name} runs where verl's step is"
            " not known; place its window with wait/warmup/active"
        )
    o["steps"] = tuple(check_ints([steps] if isinstance(steps, int) else steps, "steps", 1)
                       if steps is not None else ())  # fmt: skip
    if steps is not None and not o["steps"]:
        raise ValueError("steps must list at least one step")
    role = o["role"]
    if role is not None:
        if not isinstance(role, str):
            raise TypeError(f"role must be a str, got {type(role).__name__} {role!r}")
        if role not in recipe.roles:
            allowed = ", ".join(recipe.roles) or "none (not a verl recipe)"
            raise ValueError(f"role {role!r} for {recipe.name} must be one of {allowed}")
    return o


def capture(
    recipe: str,
    *,
    wait: int = 0,
    warmup: int = 0,
    active: int = 1,
    repeat: int = 1,
    skip_first: int = 0,
    steps: Union[int, Sequence[int], None] = None,
    role: Optional[str] = None,
    level: str = "level1",
    export: Union[str, Sequence[str]] = "db",
    record_shapes: bool = False,
    with_modules: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
    analyse: bool = True,
    out: Union[str, os.PathLike[str], None] = None,
) -> Capture:
    """Arm ``recipe`` in this process; returns its :class:`Capture` (``.undo()`` disarms).

    The schedule is torch's, per window: ``skip_first`` steps, then ``wait`` skipped steps,
    ``warmup`` steps and ``active`` recorded steps, ``repeat`` times. ``steps`` (verl recipes):
    the global steps to capture (default every one); ``role``: actor, critic or ref (the roles
    the recipe covers; default all of them). ``level`` is level_none, level0, level1 or level2;
    ``export`` "db", "text" or both; ``record_shapes``, ``with_modules``, ``profile_memory``,
    ``with_stack`` are the profiler's; ``analyse=False`` writes unparsed data and prints the
    offline-analysis line. ``out`` is the folder above the recipe's folder (default
    ``MSTX_MARKS_OUT``, else ``./outputs``, made absolute now). A recipe may be armed once at
    a time in a process.

    >>> with capture("update_micro_batch", wait=1, warmup=1, active=2, out="prof") as handle:
    ...     handle.total, os.path.basename(handle.out)
    (4, 'prof')
    >>> capture("update_micro_batch", active=0)
    Traceback (most recent call last):
    ...
    ValueError: active must be >= 1, got 0
    """
    if not isinstance(recipe, str):
        raise TypeError(f"recipe must be a str, got {type(recipe).__name__} {recipe!r}")
    row = _BY_NAME.get(recipe)
    if row is None:
        raise ValueError(f"unknown recipe {recipe!r}; expected one of {', '.join(_BY_NAME)}")
    options = _check_options(row, dict(
        wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first,
        steps=steps, role=role, level=level, export=export, record_shapes=record_shapes,
        with_modules=with_modules, profile_memory=profile_memory, with_stack=with_stack,
        analyse=analyse, out=out,
    ))  # fmt: skip
    handle = Capture(row, options)
    with _lock:
        if any(c.recipe.name == recipe for c in _armed):
            raise ValueError(f"recipe {recipe!r} is already armed in this process; undo() it first")
        _armed.append(handle)
    if recipe in _VERL_RECIPES:
        _arm_stages()
    for target in row.targets:
        when_imported(target.module, functools.partial(handle._attach, target))
    if recipe in _MICRO:
        when_imported(_MEGATRON_ACTOR, functools.partial(_cannot_attach, row, "megatron_actor"))
    return handle


@atexit.register
def _stop_unfinished() -> None:
    """A loop that ended before its window did: stop the profiler so the trace of the steps
    that ran is written, and say so once, rather than lose the capture silently."""
    for handle in list(_armed):
        for window in handle.stepper.open_windows():
            warn_once(
                ("recipe unfinished", handle.recipe.name),
                f"recipe {handle.recipe.name}: the process ends after {window.steps} of its"
                f" {window.total} steps; the trace in {window.context.folder} holds those",
            )
        handle.undo()


def armed() -> tuple[Capture, ...]:
    """The captures armed in this process that are not done yet.

    >>> handle = capture("rollout_decode")
    >>> [c.recipe.name for c in armed()]
    ['rollout_decode']
    >>> handle.undo(); armed()
    ()
    """
    with _lock:
        return tuple(_armed)


_INT_KEYS = ("wait", "warmup", "active", "repeat", "skip_first")
_BOOL_KEYS = ("record_shapes", "with_modules", "profile_memory", "with_stack", "analyse")
#: Short names (verl's ``contents`` words) for the profiler's flags.
_ALIASES = {"module": "with_modules", "memory": "profile_memory", "shapes": "record_shapes",
            "stack": "with_stack", "analysis": "analyse"}  # fmt: skip
_KEYS = (*_INT_KEYS, "steps", "role", "level", "export", *_BOOL_KEYS, "out")
_INT = re.compile(r"[+-]?[0-9]+")
_BOOLS = {"true": True, "1": True, "on": True, "yes": True,
          "false": False, "0": False, "off": False, "no": False}  # fmt: skip


def _parse_value(key: str, value: str) -> Any:
    if key in _INT_KEYS:
        if not _INT.fullmatch(value):
            raise ValueError(f"{key}={value!r} must be an int")
        return int(value)
    if key in _BOOL_KEYS:
        if value.lower() not in _BOOLS:
            raise ValueError(f"{key}={value!r} must be true or false")
        return _BOOLS[value.lower()]
    if key == "steps":
        items = [v.strip() for v in value.strip("[]").replace("|", ",").split(",") if v.strip()]
        if not items or not all(_INT.fullmatch(v) for v in items):
            raise ValueError(f"steps={value!r} must be a list of ints, e.g. steps=[2,4]")
        return [int(v) for v in items]
    return value


def _parse_entry(entry: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = entry.partition(":")
    name = name.strip()
    if not name:
        raise ValueError("expected RECIPE:key=value,..., e.g. rollout_decode:wait=1,active=2")
    options: dict[str, Any] = {}
    # Commas separate keys, except inside [...] (steps=[2,4]).
    for item in re.split(r",(?![^\[]*\])", rest):
        if not item.strip():
            continue
        key, sep, value = (part.strip() for part in item.partition("="))
        key = _ALIASES.get(key, key)
        if not sep or not key or not value:
            raise ValueError(f"{item.strip()!r} is not key=value")
        if key not in _KEYS:
            raise ValueError(f"unknown key {key!r}; expected keys among {', '.join(_KEYS)}")
        if key in options:
            raise ValueError(f"{key} is given twice")
        options[key] = _parse_value(key, value)
    return name, options


def arm_from_text(text: str) -> None:
    """Arm the recipes of ``MSTX_MARKS_CAPTURE``'s text: ``RECIPE:key=value,...`` entries
    separated by ``;``; the keys of :func:`capture` (ints; ``steps=[2,4]``; booleans true or
    false; ``module``, ``memory``, ``shapes``, ``stack`` and ``analysis`` also name the flags).
    An entry that is wrong warns once, naming ``MSTX_MARKS_CAPTURE``, the entry and the rule,
    and arms nothing; the others are armed. Never raises.

    >>> arm_from_text("rollout_decode:wait=2,active=3; update_mini_batch:active=1,steps=[2,4]")
    >>> [(c.recipe.name, c.total, c.steps) for c in armed()]
    [('rollout_decode', 5, ()), ('update_mini_batch', 1, (2, 4))]
    >>> for c in armed():
    ...     c.undo()
    """
    bad: list[tuple[str, Exception]] = []
    for raw in str(text).split(";"):
        entry = raw.strip()
        if not entry:
            continue
        try:
            name, options = _parse_entry(entry)
            capture(name, **options)
        except Exception as exc:
            bad.append((entry, exc))
    if bad:  # one warning for the variable, every echoed value cut (a huge value is no log)
        first, why = bad[0]
        more = f"; and {len(bad) - 1} more bad entries" if len(bad) > 1 else ""
        warn_once(
            (env.CAPTURE, text[: env.QUOTE]),
            f"ignoring {env.quoted(first)} in {env.CAPTURE}={env.quoted(str(text))}:"
            f" {env.shown(why, 2 * env.QUOTE)}{more}",
        )


def recipes_table() -> str:
    """The listing of ``mstx-marks recipes``: each recipe, where it runs, what a step is, the
    folder it writes and the hand edit of the guide it replaces.

    >>> print(recipes_table().splitlines()[0])
    MSTX_MARKS_CAPTURE="RECIPE:wait=N,warmup=N,active=N[,repeat=N][,steps=[2,4]][,role=..][,...]"
    >>> "<out>/Ref_compute_log_prob" in recipes_table()
    True
    """
    lines = [
        f'{env.CAPTURE}="RECIPE:wait=N,warmup=N,active=N[,repeat=N][,steps=[2,4]][,role=..][,...]"',
        "keys: " + ", ".join(_KEYS) + " (several recipes separated by ';')",
        f"traces in <out>/<folder>; <out> = out=, else {env.OUT}, else ./{DEFAULT_OUT}",
    ]
    for r in RECIPES:
        kinds = {
            "loop": "a new window each call",
            "after": "a step, stepped when it returns",
            "next": "a step, stepped when the next one starts or the loop returns",
        }
        where = [f"{m}:{p} ({kinds['loop' if k == 'loop' else b]})" for m, p, k, _, b in r.targets]
        lines += [
            "",
            r.name,
            "  runs in:   " + "\n             ".join(where),
            f"  a step:    {r.step}",
            f"  replaces:  {r.replaces}",
            f"  for:       {r.frameworks}",
            f"  folder:    <out>/{_folder_words(r)}",
        ]
        if r.roles:
            lines.append(f"  roles:     {', '.join(r.roles)} (role=...), steps=[...] verl steps")
    return "\n".join(lines)


def _folder_words(recipe: Recipe) -> str:
    tags = sorted({t.tag for t in recipe.targets})
    if "{tag}" in recipe.folder:
        return " or ".join(recipe.folder.format(tag=t) for t in tags)
    roles = "{" + ",".join(r for r in recipe.roles if r != "ref") + "}"
    return recipe.folder.format(role=roles, Role="", backend="{fsdp,megatron}")
