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

The framework presets built on it live in :mod:`mstx_marks.capture.presets`;
``MSTX_MARKS_INSTRUMENT`` applies them in every process of a job.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import threading
from collections.abc import Sequence
from types import ModuleType, TracebackType
from typing import Any, Callable, Union

from mstx_marks.base import env
from mstx_marks.base.diagnostics import warn
from mstx_marks.base.forking import new_lock
from mstx_marks.base.names import check_name, fit_name
from mstx_marks.base.phases import Phase
from mstx_marks.core.engine import ArgsGate, rewrap, target_name, wrap_function
from mstx_marks.core.gates import Gate, noop_gate
from mstx_marks.core.ranges import mark
from mstx_marks.core.sampling import Policy

__all__ = [
    "LIVE",
    "CellPatch",
    "Instrumented",
    "Patch",
    "instrument",
    "replace",
    "replace_closure",
]

#: A class, a module, any object with attributes, or an import path "package.module:Class".
Target = Union[type, ModuleType, str, object]

_lock = new_lock(reentrant=True)
_ABSENT = object()
_RANGES = wrap_function.__module__
_busy = threading.local()


class Patch:
    """One live patch: ``installed`` replaced ``original`` as attribute ``attr`` of ``owner``."""

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

    def current(self) -> Any:
        return getattr(self.owner, "__dict__", {}).get(self.attr, _ABSENT)

    def put_back(self) -> None:
        if self.owned:
            setattr(self.owner, self.attr, self.original)
        else:
            delattr(self.owner, self.attr)


class CellPatch(Patch):
    """One live patch of a closure variable: ``owner`` is the cell."""

    __slots__ = ()

    def current(self) -> Any:
        return self.owner.cell_contents  # type: ignore[attr-defined]

    def put_back(self) -> None:
        self.owner.cell_contents = self.original  # type: ignore[attr-defined]


#: Each installed wrapper -> its patch: how a second instrument() call recognizes our wrappers.
#: Keyed by the wrapper itself (held alive by the patch anyway), never by id(): ids are reused.
LIVE: dict[object, Patch] = {}


def _is_live(obj: object) -> bool:
    try:
        return obj in LIVE
    except TypeError:  # an unhashable callable cannot be one of our wrappers
        return False


class Instrumented:
    """What :func:`instrument` or a preset did; :meth:`undo` restores every patched attribute.

    ``patched`` lists the attributes wrapped, ``skipped`` pairs of (attribute, reason). Also a
    context manager that undoes on exit. ``undo()`` may be called any number of times.
    """

    def __init__(self, patches: Sequence[Patch], skipped: Sequence[tuple[str, str]]) -> None:
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


def _restore(patch: Patch) -> None:
    del LIVE[patch.installed]
    if patch.current() is not patch.installed:
        # Someone patched over our wrapper; restoring would throw their patch away. Ours stays
        # inside theirs, so it is switched off for good: undo means no more ranges from it.
        _retire(patch.installed)
        warn(
            f"{patch.label} was replaced after it was instrumented; it is left as it is, "
            "and the range it held is switched off"
        )
    else:
        patch.put_back()


def _retire(wrapper: object, depth: int = 0) -> None:
    """Point every gate a wrapper of ours reads (through its closure) at a closed gate."""
    func = getattr(wrapper, "__func__", wrapper)  # a staticmethod or classmethod of ours
    for cell in getattr(func, "__closure__", None) or ():
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(held, (Gate, ArgsGate)):
            cell.cell_contents = noop_gate(held.domain)
        elif callable(held) and depth < 3 and getattr(held, "__module__", "") == _RANGES:
            _retire(held, depth + 1)  # the range wrapper behind a sampling or guard wrapper


def _label(target: object) -> str:
    if isinstance(target, ModuleType):
        return target.__name__
    if isinstance(target, type):
        return f"{target.__module__}:{target.__qualname__}"
    return repr(target)


def _missing(label: str, owner: object, attr: str) -> AttributeError:
    public = [n for n in dir(owner) if not n.startswith("_")]
    import difflib  # only for this message: not at import

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


def _binds_nothing(raw: object) -> bool:
    """Whether ``raw``, stored on a class, is called as it is: it is no descriptor."""
    return not isinstance(raw, (staticmethod, classmethod)) and not hasattr(type(raw), "__get__")


def _guarded(raw: Callable[..., Any], wrapped: Callable[..., Any]) -> Callable[..., Any]:
    """For a builtin: the range machinery may itself call it (``len``), so a call made while
    this thread is already inside the wrapper goes straight to the builtin."""

    @functools.wraps(raw)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:  # no builtin is called here: it may be the one instrumented
            busy = _busy.on
        except AttributeError:
            busy = False
        if busy:
            return raw(*args, **kwargs)
        _busy.on = True
        try:
            return wrapped(*args, **kwargs)
        finally:
            _busy.on = False

    return guarded


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
    their kind. ``name`` (a str or a :class:`~mstx_marks.base.phases.Phase`) defaults to the
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
    ('stepped', ('mstx_marks.capture.instrument:Engine.step',))
    >>> instrument(Engine, "step").skipped
    (('mstx_marks.capture.instrument:Engine.step', 'already instrumented'),)
    >>> handle.undo()
    """
    if name is not None and not isinstance(name, Phase):
        check_name(name)
    if env.off():  # the hard off switch: nothing is patched
        names = _attr_names(attrs)
        return Instrumented((), [(f"{_resolve(target)[1]}.{a}", env.OFF) for a in names])

    def wrap(owner: object, attr: str, raw: Any) -> Any:
        if name is not None:
            site_name: str | Phase = name
        elif isinstance(owner, type):
            site_name = fit_name(f"{owner.__qualname__}.{attr}")
        else:
            site_name = fit_name(target_name(raw))
        # One site per attribute: each target gets its own sampling counter.
        site = mark(site_name, domain=domain, stream=stream, sample=sample)
        wrapped = rewrap(raw, site.wrap)
        if owner is builtins:
            wrapped = _guarded(raw, wrapped)
        if isinstance(owner, type) and _binds_nothing(raw):
            # A C function, a partial or a callable instance stored on a class is called
            # without the instance; our wrapper, a Python function, would be bound to it.
            return staticmethod(wrapped)
        return wrapped

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
        patches: list[Patch] = []
        try:
            for attr, raw, owned in plan:
                wrapped = wrap(owner, attr, raw)
                setattr(owner, attr, wrapped)
                patches.append(Patch(owner, attr, raw, wrapped, owned, f"{label}.{attr}"))
                LIVE[wrapped] = patches[-1]
        except BaseException:
            Instrumented(patches, ()).undo()  # an owner that refuses one attribute gets none
            raise
        return Instrumented(patches, skipped)


def replace_closure(
    func: Callable[..., Any],
    var: str,
    wrap: Callable[[Any], Any],
    label: str,
) -> Instrumented:
    """Replace what closure variable ``var`` of ``func`` holds by ``wrap(held)``; undo restores it.

    For a wrapper that calls the function it wraps through its closure (verl's
    ``DistProfiler.annotate`` does): patching there puts our range inside what the wrapper does
    around the call, where patching the attribute would put it outside. Skipped (not wrapped
    twice) when the cell already holds a live patch of ours.

    >>> def outer(f):
    ...     def wrapper(x):
    ...         return f(x) + 1
    ...     return wrapper
    >>> w = outer(lambda x: x * 10)
    >>> with replace_closure(w, "f", lambda f: lambda x: f(x) * 2, "w.f"):
    ...     w(1)
    21
    >>> w(1)
    11
    """
    names = func.__code__.co_freevars
    if var not in names or func.__closure__ is None:
        raise ValueError(f"{label}: {func!r} has no closure variable {var!r} (it has {names})")
    cell = func.__closure__[names.index(var)]
    with _lock:
        held = cell.cell_contents
        if _is_live(held):
            return Instrumented((), [(label, "already instrumented")])
        wrapped = wrap(held)
        cell.cell_contents = wrapped
        patch = CellPatch(cell, var, held, wrapped, True, label)
        LIVE[wrapped] = patch
        return Instrumented([patch], ())
