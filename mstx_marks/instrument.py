"""Instrument code without editing it: wrap class or module attributes in ranges at run time.

RL frameworks are profiled by patching their entry points rather than by editing, backing up
and restoring their source files. :func:`instrument` wraps attributes the same way
``@mstx_range`` would have, and the handle it returns puts back the exact original objects.

>>> import json
>>> from mstx_marks import configure, default_recorder, first
>>> configure(backend="record")
>>> default_recorder().clear()
>>> with instrument(json, "dumps", name="json_dumps", sample=first(2)):
...     _ = [json.dumps(i) for i in range(5)]
>>> [r.name for r in default_recorder().records()]
['json_dumps', 'json_dumps']
>>> json.dumps.__module__
'json'

The presets patch the known entry points of verl, vLLM and SGLang, named by the phase registry,
and skip what the installed version lacks. Ranges are emitted by the process that runs the code,
so call a preset in every process that should be traced: in a Ray job, for example,
``ray.init(runtime_env={"worker_process_setup_hook": "mstx_marks.instrument.instrument_verl"})``.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import threading
import warnings
from collections.abc import Sequence
from types import ModuleType, TracebackType
from typing import Any, Callable, NamedTuple, Union

from .names import check_name, fit_name
from .phases import (
    COMPUTE_LOG_PROB,
    COMPUTE_REF_LOG_PROB,
    COMPUTE_RM_SCORE,
    COMPUTE_VALUES,
    GENERATE_SEQUENCES,
    SGLANG_FORWARD,
    TRAIN_BATCH,
    UPDATE_ACTOR,
    UPDATE_CRITIC,
    VLLM_ONE_STEP,
    Phase,
)
from .ranges import _target_name, _wrap, mark, rewrap
from .sampling import Policy

__all__ = [
    "PRESETS",
    "Instrumented",
    "PresetEntry",
    "instrument",
    "instrument_sglang",
    "instrument_verl",
    "instrument_vllm",
    "replace",
]

#: A class, a module, any object with attributes, or an import path "package.module:Class".
Target = Union[type, ModuleType, str, object]

_lock = threading.RLock()
_ABSENT = object()


class _Patch:
    """One live patch: ``installed`` replaced ``original`` on ``owner``."""

    __slots__ = ("attr", "installed", "label", "original", "owned", "owner")

    def __init__(
        self, owner: object, attr: str, original: Any, installed: Any, owned: bool, label: str
    ) -> None:
        self.owner = owner
        self.attr = attr
        self.original = original
        self.installed = installed
        # Whether the owner's own __dict__ held the attribute: restore it, else delete the override.
        self.owned = owned
        self.label = label


#: Each installed wrapper -> its patch: how a second instrument() call recognizes our wrappers.
#: Keyed by the wrapper itself (held alive by the patch anyway), never by id(): ids are reused.
_live: dict[object, _Patch] = {}


def _is_live(obj: object) -> bool:
    try:
        return obj in _live
    except TypeError:  # an unhashable callable cannot be one of our wrappers
        return False


class Instrumented:
    """What :func:`instrument` or a preset did; :meth:`undo` restores every patched attribute.

    ``patched`` lists the attributes wrapped, ``skipped`` pairs of (attribute, reason). Also a
    context manager that undoes on exit. ``undo()`` may be called any number of times.
    """

    def __init__(self, patches: Sequence[_Patch], skipped: Sequence[tuple[str, str]]) -> None:
        self._patches = list(patches)
        self.patched: tuple[str, ...] = tuple(p.label for p in patches)
        self.skipped: tuple[tuple[str, str], ...] = tuple(skipped)

    def undo(self) -> None:
        """Put back the original objects (newest patch first); later calls do nothing."""
        with _lock:
            while self._patches:
                _restore(self._patches.pop())

    def __enter__(self) -> Instrumented:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.undo()

    def __repr__(self) -> str:
        return f"Instrumented(patched={list(self.patched)!r}, skipped={list(self.skipped)!r})"


def _restore(patch: _Patch) -> None:
    del _live[patch.installed]
    current = getattr(patch.owner, "__dict__", {}).get(patch.attr, _ABSENT)
    if current is not patch.installed:
        # Someone patched over our wrapper; restoring would throw their patch away.
        warnings.warn(
            f"{patch.label} was replaced after it was instrumented; it is left as it is",
            RuntimeWarning,
            stacklevel=4,
        )
    elif patch.owned:
        setattr(patch.owner, patch.attr, patch.original)
    else:
        delattr(patch.owner, patch.attr)


def _label(target: object) -> str:
    if isinstance(target, ModuleType):
        return target.__name__
    if isinstance(target, type):
        return f"{target.__module__}:{target.__qualname__}"
    return repr(target)


def _missing(label: str, owner: object, attr: str) -> AttributeError:
    public = [n for n in dir(owner) if not n.startswith("_")]
    close = difflib.get_close_matches(attr, public, n=3)
    callables = [n for n in public if callable(getattr(owner, n, None))]
    hint = f"; close: {', '.join(close)}" if close else ""
    shown = ", ".join(callables[:20]) + (", ..." if len(callables) > 20 else "")
    return AttributeError(
        f"{label} has no attribute {attr!r}{hint}; its public callables: {shown or 'none'}"
    )


def _resolve(target: Target) -> tuple[object, str]:
    """The object whose attributes are patched, and how reports name it."""
    if not isinstance(target, str):
        return target, _label(target)
    module_name, _, qualname = target.partition(":")
    owner: object = importlib.import_module(module_name)
    label = module_name
    for part in qualname.split(".") if qualname else ():
        found = getattr(owner, part, _ABSENT)
        if found is _ABSENT:
            raise _missing(label, owner, part)
        owner, label = found, f"{label}:{part}" if label == module_name else f"{label}.{part}"
    return owner, label


def _stored(owner: object, label: str, attr: str) -> tuple[Any, bool]:
    """The attribute as stored (a staticmethod stays one) and whether ``owner`` itself holds it."""
    own = getattr(owner, "__dict__", {})
    if attr in own:
        return own[attr], True
    if isinstance(owner, type):
        for base in owner.__mro__[1:]:
            if attr in vars(base):
                return vars(base)[attr], False
    else:
        found = getattr(owner, attr, _ABSENT)  # a module's __getattr__, an instance's class
        if found is not _ABSENT:
            return found, False
    raise _missing(label, owner, attr)


def _check_patchable(raw: object, label: str, attr: str) -> None:
    if isinstance(raw, type):
        raise TypeError(f"cannot instrument {label}.{attr}: it is a class; instrument its methods")
    if not isinstance(raw, (staticmethod, classmethod)) and not callable(raw):
        raise TypeError(
            f"cannot instrument {label}.{attr}: it is a {type(raw).__name__}, "
            "not a function or method"
        )


def _attr_names(attrs: str | Sequence[str]) -> tuple[str, ...]:
    names = (attrs,) if isinstance(attrs, str) else tuple(attrs)
    if not names:
        raise ValueError("instrument() needs at least one attribute name, got none")
    for attr in names:
        if not isinstance(attr, str) or not attr.isidentifier():
            raise ValueError(f"attribute names must be Python identifiers, got {attr!r}")
    return tuple(dict.fromkeys(names))


def instrument(
    target: Target,
    attrs: str | Sequence[str],
    *,
    name: str | Phase | None = None,
    domain: str | None = None,
    stream: object = None,
    sample: Policy | None = None,
) -> Instrumented:
    """Wrap ``target``'s attributes ``attrs`` so that each call is a range; returns the undo handle.

    ``target`` is a class, a module, any object, or an import path ``"package.module:Class"``.
    Plain, static, class and async methods, generator functions and module functions keep
    their kind. ``name`` (a str or a :class:`~mstx_marks.phases.Phase`) defaults to the
    attribute's qualified name; ``domain``, ``stream`` and ``sample`` mean what they mean for
    :func:`~mstx_marks.mstx_range`, and each attribute counts its own calls for ``sample``. An
    attribute inherited from a base class is wrapped on ``target`` only. Instrumenting an
    attribute again is skipped, not wrapped twice. Nothing is patched if any attribute is
    missing (an AttributeError listing what exists) or is not a function (a TypeError).

    >>> class Engine:
    ...     def step(self):
    ...         return "stepped"
    >>> handle = instrument(Engine, "step", name="vllm_one_step")
    >>> Engine().step(), handle.patched
    ('stepped', ('mstx_marks.instrument:Engine.step',))
    >>> instrument(Engine, "step").skipped
    (('mstx_marks.instrument:Engine.step', 'already instrumented'),)
    >>> handle.undo()
    """
    if name is not None and not isinstance(name, Phase):
        check_name(name)

    def wrap(owner: object, attr: str, raw: Any) -> Any:
        if name is not None:
            site_name: str | Phase = name
        elif isinstance(owner, type):
            site_name = fit_name(f"{owner.__qualname__}.{attr}")
        else:
            site_name = fit_name(_target_name(raw))
        # One site per attribute: each target gets its own sampling counter.
        site = mark(site_name, domain=domain, stream=stream, sample=sample)
        return rewrap(raw, functools.partial(_wrap, site=site))

    return replace(target, attrs, wrap)


def replace(
    target: Target,
    attrs: str | Sequence[str],
    wrap: Callable[[object, str, Any], Any],
    *,
    again: bool = False,
) -> Instrumented:
    """Replace each attribute of ``target`` by ``wrap(owner, attr, stored)``; undo restores it.

    The mechanism under :func:`instrument`, for other wrappers (``profiler.capture_steps``).
    ``stored`` is the attribute as stored (a staticmethod stays one; for an instance or module,
    what ``getattr`` gives). Attributes already replaced by a live patch are skipped unless
    ``again``. All or nothing: a missing or non-function attribute, or a failing ``wrap``,
    leaves ``target`` untouched.

    >>> class Engine:
    ...     def step(self):
    ...         return 1
    >>> with replace(Engine, "step", lambda owner, attr, raw: lambda self: raw(self) + 1):
    ...     Engine().step()
    2
    >>> Engine().step()
    1
    """
    names = _attr_names(attrs)
    owner, label = _resolve(target)
    with _lock:
        plan: list[tuple[str, Any, bool]] = []
        skipped: list[tuple[str, str]] = []
        for attr in names:
            raw, owned = _stored(owner, label, attr)
            _check_patchable(raw, label, attr)
            if not again and _is_live(raw):
                skipped.append((f"{label}.{attr}", "already instrumented"))
            else:
                plan.append((attr, raw, owned))
        patches: list[_Patch] = []
        try:
            for attr, raw, owned in plan:
                wrapped = wrap(owner, attr, raw)
                setattr(owner, attr, wrapped)
                patches.append(_Patch(owner, attr, raw, wrapped, owned, f"{label}.{attr}"))
                _live[wrapped] = patches[-1]
        except BaseException:
            Instrumented(patches, ()).undo()  # an owner that refuses one attribute gets none
            raise
        return Instrumented(patches, skipped)


# --- presets -------------------------------------------------------------------------------------


class PresetEntry(NamedTuple):
    """One known entry point: attribute ``attr`` of ``owner`` (``"module:Class"``) is ``phase``."""

    framework: str
    owner: str
    attr: str
    phase: Phase


# verl <= 0.7 has the same worker classes in both backends' modules.
_VERL_LEGACY = [
    PresetEntry("verl", f"verl.workers.{backend}:{cls}", attr, phase)
    for backend in ("fsdp_workers", "megatron_workers")
    for cls, attr, phase in [
        ("ActorRolloutRefWorker", "generate_sequences", GENERATE_SEQUENCES),
        ("ActorRolloutRefWorker", "compute_log_prob", COMPUTE_LOG_PROB),
        ("ActorRolloutRefWorker", "compute_ref_log_prob", COMPUTE_REF_LOG_PROB),
        ("ActorRolloutRefWorker", "update_actor", UPDATE_ACTOR),
        ("CriticWorker", "compute_values", COMPUTE_VALUES),
        ("CriticWorker", "update_critic", UPDATE_CRITIC),
        ("RewardModelWorker", "compute_rm_score", COMPUTE_RM_SCORE),
    ]
]
_VERL_ACTOR = "verl.workers.engine_workers:ActorRolloutRefWorker"

#: Every framework version's entry points, in one table: a new version means editing rows here.
#: verl 0.8+ workers are in engine_workers; its TrainingWorker serves critic and SFT alike, so it
#: is marked as train_batch. From vLLM 0.10 on, vllm.engine.llm_engine.LLMEngine is the v1
#: class: its row then finds the method already instrumented and says so.
PRESETS: tuple[PresetEntry, ...] = (
    *_VERL_LEGACY,
    PresetEntry("verl", _VERL_ACTOR, "compute_log_prob", COMPUTE_LOG_PROB),
    PresetEntry("verl", _VERL_ACTOR, "compute_ref_log_prob", COMPUTE_REF_LOG_PROB),
    PresetEntry("verl", _VERL_ACTOR, "update_actor", UPDATE_ACTOR),
    PresetEntry("verl", "verl.workers.engine_workers:TrainingWorker", "train_batch", TRAIN_BATCH),
    PresetEntry(
        "verl",
        "verl.experimental.agent_loop.agent_loop:AgentLoopWorker",
        "generate_sequences",
        GENERATE_SEQUENCES,
    ),
    PresetEntry("vllm", "vllm.v1.engine.llm_engine:LLMEngine", "step", VLLM_ONE_STEP),
    PresetEntry("vllm", "vllm.engine.llm_engine:LLMEngine", "step", VLLM_ONE_STEP),
    PresetEntry(
        "sglang", "sglang.srt.model_executor.model_runner:ModelRunner", "forward", SGLANG_FORWARD
    ),
)


def _preset(framework: str, stream: object, sample: Policy | None) -> Instrumented:
    patches: list[_Patch] = []
    skipped: list[tuple[str, str]] = []
    for entry in PRESETS:
        if entry.framework != framework:
            continue
        try:
            handle = instrument(
                entry.owner,
                entry.attr,
                name=entry.phase,
                stream=stream,
                sample=sample,
            )
        # A framework's import can fail in many ways (a missing torch, a CUDA probe); the
        # preset's promise is to skip what cannot be patched, and to say why.
        except Exception as exc:
            skipped.append((f"{entry.owner}.{entry.attr}", f"{type(exc).__name__}: {exc}"))
            continue
        patches += handle._patches
        skipped += handle.skipped
    return Instrumented(patches, skipped)


def instrument_verl(*, stream: object = None, sample: Policy | None = None) -> Instrumented:
    """Wrap verl's worker methods (rollout, log-probs, updates, values, reward model) as phases.

    >>> report = instrument_verl()  # doctest: +SKIP
    >>> report.patched  # doctest: +SKIP
    ('verl.workers.engine_workers:ActorRolloutRefWorker.compute_log_prob', ...)
    """
    return _preset("verl", stream, sample)


def instrument_vllm(*, stream: object = None, sample: Policy | None = None) -> Instrumented:
    """Wrap vLLM's ``LLMEngine.step`` as ``vllm_one_step`` (domain ``vllm_one_step``).

    >>> from mstx_marks import window
    >>> report = instrument_vllm(sample=window(30, 70))  # decode steps 30..69 only
    >>> report.undo()
    """
    return _preset("vllm", stream, sample)


def instrument_sglang(*, stream: object = None, sample: Policy | None = None) -> Instrumented:
    """Wrap SGLang's ``ModelRunner.forward`` as ``sglang_forward`` (domain ``sglang_forward``).

    >>> instrument_sglang().undo()
    """
    return _preset("sglang", stream, sample)
