"""Framework presets: the places where verl, vLLM, vllm-ascend, SGLang and MindSpeed-RL do their
work, wrapped in ranges in the process that runs them.

A preset is one module of this package (``presets/verl.py``, ``vllm.py``, ``sglang.py``,
``mindspeed_rl.py``, ``megatron.py``): its names (``PRESETS``), its :class:`Target` rows (which
module, which attribute, which phase, how to wrap it, and for which versions), and optionally
the classes it checks when built, its own phases, its profiler recipes and its plugin entry
points (:mod:`~mstx_marks.capture.presets.declare`). The package finds every module that
declares ``PRESETS`` when it is imported, and derives from them each list below, the presets
page of the docs, the recipes and the entry points; ``docs/guides/write-a-preset.md`` shows a
whole one. :func:`arm` waits for each module to be imported (never importing a
framework itself, so no device is probed early) and patches it then; :func:`apply` imports and
patches now. ``MSTX_MARKS_INSTRUMENT=verl,vllm`` arms them in every process of a job (see
:mod:`mstx_marks.launch.activate`).

A row on a class covers its subclasses too: one that overrides the method (existing when the
row patches, or created later, also when Ray rebuilds it by value in an actor) is patched the
same way, and undone with it (:func:`~mstx_marks.capture.presets.target.patch_target`).

A preset that finds a module without the attribute it expects says so once, naming the
framework's version and what it looked for. A process that imported one of the modules a preset
targets and got nothing patched says so at exit; one that imported the framework without any of
those modules (a Ray driver of a verl job, which runs no worker) did no framework work to mark,
and says nothing.

>>> from mstx_marks.capture import presets
>>> sorted(presets.FRAMEWORKS)[:5]
['megatron', 'mindspeed_rl', 'sglang', 'verl', 'verl_modules']
>>> t = presets.targets("vllm")[0]
>>> t.module, t.path, t.phase
('vllm.v1.engine.core', 'EngineCore.step', 'vllm_one_step')
"""

from __future__ import annotations

import atexit
import functools
import importlib
import pkgutil
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from mstx_marks.base import env
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.forking import new_lock
from mstx_marks.base.import_hooks import when_imported
from mstx_marks.base.phases import Phase, register
from mstx_marks.capture.instrument import Instrumented
from mstx_marks.capture.presets.built import Built, watch_built
from mstx_marks.capture.presets.declare import Preset, Recipe, RecipeTarget
from mstx_marks.capture.presets.target import (
    Options,
    SubclassWatch,
    Target,
    combine,
    named_per_call,
    patch_target,
)
from mstx_marks.core.process import PROCESS
from mstx_marks.core.sampling import Policy

__all__ = [
    "ALIASES",
    "BUILT",
    "FRAMEWORKS",
    "MODULES",
    "PRESETS",
    "RECIPES",
    "TARGETS",
    "Options",
    "Target",
    "apply",
    "arm",
    "covering",
    "entry_points",
    "framework_version",
    "named_per_call",
    "nothing_patched",
    "patched",
    "preset_name",
    "targets",
]


def _preset_modules() -> tuple[ModuleType, ...]:
    """Every module of this package that declares ``PRESETS``, in their ``ORDER`` (those
    without one after, by name). Each one's own ``PHASES`` are registered as it is found."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            if hasattr(module, "PRESETS"):
                found.append(module)
                for phase in _declared(module, "PHASES", Phase):
                    register(phase)
    return tuple(sorted(found, key=lambda m: (getattr(m, "ORDER", float("inf")), m.__name__)))


def _declared(module: ModuleType, name: str, kind: type | tuple[type, ...]) -> tuple[Any, ...]:
    """``module``'s ``name`` (a tuple of ``kind``; absent: empty); a clear error otherwise."""
    value = getattr(module, name, ())
    if not isinstance(value, tuple) or not all(isinstance(v, kind) for v in value):
        raise TypeError(f"{module.__name__}.{name} must be a tuple of {kind}, got {value!r}")
    return value


def _check(modules: Iterable[ModuleType]) -> None:
    """What the presets declare holds together: names unique, each row its module's."""
    seen: dict[str, str] = {}
    for module in modules:
        own = {p.name for p in _declared(module, "PRESETS", Preset)}
        for p in _declared(module, "PRESETS", Preset):
            for name in (p.name, *p.aliases):
                if name in seen:
                    raise ValueError(f"{module.__name__}: preset name {name!r} is {seen[name]}'s")
                seen[name] = module.__name__
        rows = (*_declared(module, "TARGETS", Target), *_declared(module, "BUILT", Built))
        for row in rows:
            if row.framework not in own:
                raise ValueError(
                    f"{module.__name__}: {row!r} names {row.framework!r}, not one of its"
                    f" PRESETS ({', '.join(sorted(own))})"
                )


#: The preset modules, in the order their presets are listed.
MODULES: tuple[ModuleType, ...] = _preset_modules()
_check(MODULES)
_ALL = tuple(p for m in MODULES for p in _declared(m, "PRESETS", Preset))
#: Every preset: the frameworks' first, then those named on their own (per-module hooks,
#: vLLM's dp_analysis steps, Megatron's pp schedules).
PRESETS: tuple[Preset, ...] = (
    *(p for p in _ALL if not p.on_its_own),
    *(p for p in _ALL if p.on_its_own),
)
#: The names ``MSTX_MARKS_INSTRUMENT`` takes.
FRAMEWORKS: tuple[str, ...] = tuple(p.name for p in PRESETS)
#: Other names a preset answers to (``vllm_ascend``: the ``vllm`` preset).
ALIASES: dict[str, str] = {a: p.name for p in PRESETS for a in p.aliases}
_BY_NAME: dict[str, Preset] = {p.name: p for p in PRESETS}
env.declare_presets(FRAMEWORKS, ALIASES)


_lock = new_lock()
_handles: dict[str, list[Instrumented]] = {f: [] for f in FRAMEWORKS}
_armed: dict[str, Options] = PROCESS.presets  # type: ignore[assignment]
#: The watches of :data:`BUILT` rows: they check classes, they mark no phase.
_watches: list[Instrumented] = []


def preset_name(name: str) -> str:
    """The preset ``name`` stands for (an alias resolved); a clear error for an unknown one.

    >>> preset_name("vllm_ascend")
    'vllm'
    >>> preset_name("vlm")
    Traceback (most recent call last):
    ...
    ValueError: unknown framework 'vlm' (did you mean 'vllm'?); expected one of verl, vllm, ...
    """
    name = ALIASES.get(name, name)
    if name in FRAMEWORKS:
        return name
    import difflib  # only for this message

    close = difflib.get_close_matches(name, [*FRAMEWORKS, *ALIASES], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(
        f"unknown framework {name[:60]!r}{hint}; expected one of {', '.join(FRAMEWORKS)}"
        f" (or {', '.join(ALIASES)})"
    )


def targets(framework: str) -> tuple[Target, ...]:
    """The rows of ``framework``'s preset (an alias's: its preset's)."""
    framework = preset_name(framework)
    return tuple(t for t in TARGETS if t.framework == framework)


def framework_version(framework: str) -> str:
    """The installed version of ``framework``, or ``"unknown"``."""
    from importlib import metadata

    for dist in _BY_NAME[framework].distributions:
        try:
            return metadata.version(dist)
        except Exception:
            continue
    top = sys.modules.get(framework)
    return str(getattr(top, "__version__", "unknown"))


def patched(framework: str) -> tuple[str, ...]:
    """What ``framework``'s preset has patched in this process so far."""
    framework = preset_name(framework)
    with _lock:
        handles = list(_handles[framework])
    return tuple(
        label
        for h in handles
        for p in list(h._patches)
        for label in (p.labels() if isinstance(p, SubclassWatch) else (p.label,))
    )


def _resolve(module: ModuleType, path: str) -> tuple[Any, str] | None:
    *owners, attr = path.split(".")
    owner: Any = module
    for part in owners:
        owner = getattr(owner, part, None)
        # Only real classes: verl 0.6's AgentLoopWorker is a Ray actor class, not patchable.
        if not isinstance(owner, type):
            return None
    if not hasattr(owner, attr):
        return None
    return owner, attr


def _patch_module(
    module: ModuleType, rows: list[Target], options: Options, skipped: list[tuple[str, str]]
) -> list[Instrumented]:
    done = []
    missing = []
    for t in rows:
        label = f"{t.module}:{t.path}"
        found = _resolve(module, t.path)
        if found is None:
            version = framework_version(t.framework)
            skipped.append((label, f"not in {t.framework} {version} (it is in {t.versions})"))
            missing.append(t.path)
            continue
        try:
            # Reports name the framework's path, not the patched object; a subclass that
            # overrides the method is patched too, now or when it is created.
            handle = patch_target(t, found[0], found[1], options, label)
        except Exception as exc:
            skipped.append((label, f"{type(exc).__name__}: {exc}"))
            warn_once(("preset", label), f"{t.framework} preset: could not patch {label} ({exc})")
            continue
        handle.skipped = tuple((label, why) for _, why in handle.skipped)
        done.append(handle)
        skipped.extend(handle.skipped)
    if missing and not done:
        # Rows of other versions are expected to be missing; none found at all is news.
        version = framework_version(rows[0].framework)
        warn_once(
            ("preset", module.__name__),
            f"{rows[0].framework} {version}: {module.__name__} has none of {', '.join(missing)};"
            " the preset marks nothing there",
        )
    with _lock:
        _handles[rows[0].framework].extend(done)
    return done


def _by_module(framework: str) -> dict[str, list[Target]]:
    grouped: dict[str, list[Target]] = {}
    for t in targets(framework):
        grouped.setdefault(t.module, []).append(t)
    return grouped


def arm(framework: str, options: Options | None = None) -> None:
    """Patch ``framework``'s targets in this process as soon as each module is imported.

    Arming twice does nothing more. Never imports the framework itself. Under
    ``MSTX_MARKS_OFF`` nothing is armed.
    """
    if env.off():
        return
    framework = preset_name(framework)
    options = options if options is not None else Options()
    with _lock:
        if framework in _armed:
            return
        _armed[framework] = options
    for module_name, rows in _by_module(framework).items():
        when_imported(
            module_name, functools.partial(_patch_module, rows=rows, options=options, skipped=[])
        )
    _watch_built(framework)


def covering(module: str, path: str) -> str:
    """What marks ``module``'s ``path`` (``Class.method``): the preset whose row names it, or the
    call that marks it when none does. For the warning of an uncovered built class.

    >>> covering("vllm_ascend.worker.worker", "NPUWorker.execute_model")
    'MSTX_MARKS_INSTRUMENT=vllm covers it'
    >>> print(covering("my_platform.worker", "MyWorker.execute_model"))  # doctest: +ELLIPSIS
    no preset knows it: mark it with mstx_marks.instrument("my_platform.worker:MyWorker", ...)
    """
    for t in TARGETS:
        if t.module == module and t.path == path:
            armed = (
                " (armed, but this class was imported before it)" if t.framework in _armed else ""
            )
            return f"{env.INSTRUMENT}={t.framework} covers it{armed}"
    owner, _, method = path.rpartition(".")
    return f'no preset knows it: mark it with mstx_marks.instrument("{module}:{owner}", "{method}")'


def _watch_one(module: ModuleType, row: Built) -> None:
    found = _resolve(module, row.path)
    if found is None:  # another version builds it elsewhere: another row watches there
        return
    try:
        handle = watch_built(row, found[0], covering)
    except Exception as exc:
        warn_once(("built", row.path), f"{row.framework} preset: {row.path} not watched ({exc})")
        return
    with _lock:
        _watches.append(handle)


def _watch_built(framework: str) -> None:
    for row in BUILT:
        if row.framework == framework:
            when_imported(row.module, functools.partial(_watch_one, row=row))


def apply(
    framework: str,
    *,
    stream: object = None,
    sample: Policy | None = None,
    options: Options | None = None,
) -> Instrumented:
    """Import ``framework``'s target modules and patch them now; the handle undoes it.

    Modules this version lacks are reported in ``skipped`` with the reason; under
    ``MSTX_MARKS_OFF`` nothing is patched and every target is skipped for that reason.
    """
    if env.off():
        return Instrumented((), [(f"{t.module}:{t.path}", env.OFF) for t in targets(framework)])
    framework = preset_name(framework)
    options = options if options is not None else Options(stream=stream, sample=sample)
    handles: list[Instrumented] = []
    skipped: list[tuple[str, str]] = []
    for module_name, rows in _by_module(framework).items():
        try:
            module = importlib.import_module(module_name)
        # A framework's import can fail in many ways (a missing torch, a CUDA probe); the
        # preset's promise is to skip what cannot be patched, and to say why.
        except Exception as exc:
            skipped.extend((f"{t.module}:{t.path}", f"{type(exc).__name__}: {exc}") for t in rows)
            continue
        handles += _patch_module(module, rows, options, skipped)
    return combine(handles, skipped)


def nothing_patched(framework: str) -> list[str]:
    """The modules ``framework``'s preset targets that this process imported, when nothing of
    the framework was patched here: the process did framework work that no range marks. Empty
    when something was patched, or when none of those modules was imported (the process did no
    work the preset knows, such as a Ray driver that imports verl and runs no worker)."""
    framework = preset_name(framework)
    imported = [m for m in _by_module(framework) if m in sys.modules]
    if not imported or patched(framework):
        return []
    return imported


@atexit.register
def _say_if_nothing_patched() -> None:
    """``Nothing captured'' is never silent: an armed preset that patched nothing in a process
    that imported the modules it targets (see :func:`nothing_patched`)."""
    for framework in list(_armed):
        imported = nothing_patched(framework)
        if imported:
            looked = ", ".join(
                sorted({f"{t.module}:{t.path}" for t in targets(framework) if t.module in imported})
            )
            warn_once(
                ("preset nothing", framework),
                f"{framework} {framework_version(framework)}: this process imported"
                f" {', '.join(imported)} but the preset patched nothing there (looked for"
                f" {looked}): this process marked no {framework} phase",
            )


def entry_points() -> dict[str, str]:
    """The plugin entry points the presets declare: group -> object reference, each named
    ``mstx_marks`` (pyproject.toml holds the same; a test keeps the two equal).

    >>> entry_points()["vllm.general_plugins"]
    'mstx_marks.launch.plugins:vllm'
    """
    found: dict[str, str] = {}
    for p in PRESETS:
        for ep in p.entry_points:
            if ep.group in found:
                raise ValueError(f"entry point group {ep.group!r} is declared twice")
            found[ep.group] = ep.value(p.name)
    return found


def _recipes() -> tuple[Recipe, ...]:
    """Each module's recipes, with the targets other modules add to them. Those that run in any
    process come first, then those counted in verl steps (``mstx-marks recipes`` lists them so)."""
    added: dict[str, list[RecipeTarget]] = {}
    for module in MODULES:
        extra = getattr(module, "RECIPE_TARGETS", {})
        for name, more in extra.items():
            added.setdefault(name, []).extend(more)
    rows = [r._replace(targets=(*r.targets, *added.pop(r.name, ())))
            for m in MODULES for r in _declared(m, "RECIPES", Recipe)]  # fmt: skip
    if added:
        raise ValueError(f"RECIPE_TARGETS for recipes no module declares: {', '.join(added)}")
    return tuple(sorted(rows, key=lambda r: bool(r.stages)))


#: Every preset's rows, all frameworks (``targets(framework)`` gives one framework's).
TARGETS: tuple[Target, ...] = tuple(t for m in MODULES for t in _declared(m, "TARGETS", Target))
#: Where each framework builds its hot-path object, checked when built (``built.py``).
BUILT: tuple[Built, ...] = tuple(b for m in MODULES for b in _declared(m, "BUILT", Built))
#: The profiler recipes the preset modules declare (:mod:`mstx_marks.profiling.recipes` runs
#: them).
RECIPES: tuple[Recipe, ...] = _recipes()
