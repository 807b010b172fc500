"""What a verl call is, for the verl recipes: its role (actor, critic, ref), its backend (fsdp,
megatron), and the verl step it belongs to (the n-th call of a stage in its worker, counted by
patching the recipe's ``stages``).

>>> import types
>>> verl_role(types.SimpleNamespace(optimizer=None))
'ref'
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NamedTuple, Optional

from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.import_hooks import when_imported
from mstx_marks.profiling.recipes.rows import Recipe, Target, owner
from mstx_marks.profiling.windows import Hook, Site, hook_into

__all__ = [
    "VERL_WARNING",
    "Stage",
    "arm_stages",
    "backend",
    "cannot_attach",
    "count",
    "forward_only",
    "pipeline_size",
    "running_stages",
    "verl_profiler_on",
    "verl_role",
]

#: Said when a window opens in a worker whose verl profiler is on.
VERL_WARNING = (
    "verl's global profiler is on; the guide says to turn it off (global_profiler.steps=null)"
    " while a recipe captures"
)

_ABSENT = object()


def forward_only(args: tuple[Any, ...], kwargs: dict[str, Any], default: object = None) -> object:
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


def verl_role(obj: object) -> str:
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


def backend(obj: object, tag: str) -> str:
    engine = getattr(obj, "engine", obj)
    if tag.endswith("megatron") or "megatron" in type(engine).__module__:
        return "megatron"
    return "fsdp"


def pipeline_size(engine: object) -> int:
    size = getattr(getattr(engine, "engine_config", None), "pipeline_model_parallel_size", 1)
    return size if isinstance(size, int) and not isinstance(size, bool) else 1


class Stage(NamedTuple):
    worker: object
    step: int


#: The stage calls running, by the thread that entered them, innermost last. No contextvars
#: (the library's rule): each entry is its own token, so an exit finds its own entry by
#: identity, whatever ran in between (a generator exited late, another stage on the thread).
_stages: dict[int, list[Stage]] = {}


def running_stages() -> tuple[Stage, ...]:
    return tuple(_stages.get(threading.get_ident(), ()))


_stage_counts: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()
_id_counts: dict[tuple[int, str], int] = {}  # objects that cannot be weakly referenced


def count(obj: object, what: str) -> int:
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
        stage = Stage(args[0], count(args[0], self.what))
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


def arm_stages(stages: Sequence[Target]) -> None:
    """Patch the stage calls once per process (they only count: cheap, never undone)."""
    for target in stages:
        key = (target.module, target.path)
        if key not in _stage_hooks:
            _stage_hooks[key] = _StageHook(f"{target.module}:{target.path}")
            when_imported(target.module, functools.partial(_attach_stage, target))


def _attach_stage(target: Target, module: ModuleType) -> None:
    found = owner(module, target)
    if found is not None:
        hook = _stage_hooks[(target.module, target.path)]
        _stage_sites.append((hook_into(found, target.path.rpartition(".")[2], hook), hook))


def verl_profiler_on(worker: object) -> bool:
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


def cannot_attach(recipe: Recipe, what: str, module: ModuleType) -> None:
    """A framework the recipe cannot reach was imported (one of its ``unreachable``): say so
    once, naming what to use."""
    warn_once(
        ("recipe cannot attach", recipe.name, what),
        f"recipe {recipe.name}: {_verl_version()}'s legacy Megatron actor ({what}) runs its"
        " micro-batches inside megatron-core's pipeline schedule through a local closure, which"
        " cannot be patched: nothing is captured there; use update_mini_batch, or verl's Megatron"
        " engine (verl >= 0.8, trainer.use_legacy_worker_impl=disable)",
    )
