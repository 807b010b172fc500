"""One row of a framework preset (:class:`Target`), how its ranges are made (:class:`Options`),
the two common ways a row patches its target (:func:`wrap_calls`, :func:`named_per_call`), and
how a row on a class covers the subclasses that override its method (:func:`patch_target`).

The framework modules beside this one are tables of these rows.

>>> Target("vllm", "vllm.v1.engine.core", "EngineCore.step", "vllm_one_step", ">=0.11").patch
<function wrap_calls at ...>
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple

from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.forking import new_lock
from mstx_marks.base.phases import Phase, canonical
from mstx_marks.capture.instrument import LIVE, Instrumented, replace
from mstx_marks.capture.instrument import Patch as Installed
from mstx_marks.core.engine import rewrap
from mstx_marks.core.ranges import Mark
from mstx_marks.core.sampling import Policy

__all__ = [
    "MARKER",
    "CallArgs",
    "Options",
    "Patch",
    "SubclassWatch",
    "Target",
    "covered",
    "named_per_call",
    "patch_target",
    "wrap_calls",
]


@dataclass(frozen=True)
class Options:
    """How a preset's ranges are made: stream, sampling (all phases, or per phase)."""

    stream: object = None
    sample: Policy | None = None
    #: Policies by canonical phase name (``MSTX_MARKS_SAMPLE``); beats ``sample``.
    phase_samples: Mapping[str, Policy] = field(default_factory=dict)
    #: verl continuous mode: also emit our range where verl's profiler emits its own.
    duplicate_verl: bool = False

    def policy(self, name: str) -> Policy | None:
        try:
            key = canonical(name)
        except KeyError:
            key = name
        return self.phase_samples.get(key, self.phase_samples.get(name, self.sample))

    def site(
        self, name: str | Phase, domain: str | None = None, args: Mapping[str, Any] | None = None
    ) -> Mark:
        """A fresh range site (its own sampling counter) for one target; its ranges keep a copy
        of ``args`` as it is when each starts."""
        text = name.name if isinstance(name, Phase) else name
        return Mark(name, domain=domain, stream=self.stream, sample=self.policy(text), args=args)


Patch = Callable[[Any, str, "Target", Options], Instrumented]


def wrap_calls(owner: Any, attr: str, target: Target, options: Options) -> Instrumented:
    """The plain way: every call of ``owner.attr`` is one range named ``target.phase``."""
    site = options.site(target.phase, target.domain)
    return replace(owner, attr, lambda o, a, raw: rewrap(raw, site.wrap))


class CallArgs(Mapping[str, Any]):
    """The arguments of the call under way on this thread: the one mapping a range site holds,
    set before each call (the recorder copies it when the range starts, so each range keeps its
    own call's values).

    >>> args = CallArgs()
    >>> args.set({"tokens": 3})
    >>> dict(args)
    {'tokens': 3}
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def set(self, args: Mapping[str, Any]) -> None:
        self._local.args = args

    def _now(self) -> Mapping[str, Any]:
        return getattr(self._local, "args", _NO_ARGS)

    def __getitem__(self, key: str) -> Any:
        return self._now()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())


_NO_ARGS: Mapping[str, Any] = {}


def named_per_call(
    classify: Callable[[Any, Any], str | None],
    names: tuple[str, ...],
    keyword: str = "",
    describe: Callable[[Any], Mapping[str, Any]] | None = None,
) -> Callable[[Any, str, Target, Options], Instrumented]:
    """A patch under which each call of ``f(self, arg, ...)`` is a range named
    ``classify(self, arg)`` (one of ``names``), or no range when it gives None: an engine step
    by what its batch holds, an idle poll not at all. ``classify`` must not raise.

    ``arg`` is the first positional argument or, when the call passes none, the one named
    ``keyword`` (SGLang calls ``forward(forward_batch=...)`` in one place, vLLM's executors
    ``execute_model(scheduler_output)`` positionally). ``describe(arg)``, when given, is what
    the range keeps as its args (a batch's size and tokens: host values, read without a device
    sync); it must not raise either.
    """

    def patch(owner: Any, attr: str, target: Target, options: Options) -> Instrumented:
        args = CallArgs() if describe is not None else None
        sites = {name: options.site(name, target.domain, args) for name in names}

        def wrap(o: object, a: str, raw: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(raw)
            def call(self: Any, *call_args: Any, **kwargs: Any) -> Any:
                arg = call_args[0] if call_args else kwargs.get(keyword)
                name = classify(self, arg)
                if name is None:
                    return raw(self, *call_args, **kwargs)
                if args is not None and describe is not None:
                    args.set(describe(arg))
                with sites[name]:
                    return raw(self, *call_args, **kwargs)

            return call

        return replace(owner, attr, wrap)

    return patch


class Target(NamedTuple):
    """One place a framework does work: ``module``'s ``path`` (``Class.attr`` or a module
    global), emitted as ``phase`` (in ``domain``), patched by ``patch``, for ``versions``."""

    framework: str
    module: str
    path: str
    phase: str
    versions: str
    patch: Patch = wrap_calls
    domain: str | None = None


# --- subclasses that override a patched method -----------------------------------------------
#
# A row names the class that defines a method; a subclass whose own method overrides it would
# run unmarked. verl 0.8+'s AgentLoopWorkerTQ (a `@ray.remote` class at module level) is one:
# cloudpickle ships it to the actor BY VALUE, so no import of its module ever happens there and
# an import hook cannot see it. Its base travels by reference and is imported (and patched)
# first; an ``__init_subclass__`` hook on the base then sees every subclass created afterwards,
# cloudpickle's rebuilt ones included (their dict is filled after the hook runs, but the class
# Ray derives from them next is created with them complete: the hook looks along the MRO).

#: Set on each function a preset installs (on the function inside a staticmethod or
#: classmethod): how a wrapper is known after cloudpickle copied it, by value, into another
#: process where it is no live patch (a class patched where Ray pickled it).
MARKER = "__mstx_marks_preset__"

_watch_lock = new_lock()
#: class -> the watches on it (one per patched attribute)
_watches: dict[type, list[SubclassWatch]] = {}
#: class -> the handle of the ``__init_subclass__`` hook installed on it
_hooks: dict[type, Instrumented] = {}


def _mark(installed: Any, label: str) -> None:
    func = getattr(installed, "__func__", installed)
    # A builtin, a slotted callable: LIVE still knows it in this process.
    with contextlib.suppress(AttributeError, TypeError):
        setattr(func, MARKER, label)


def covered(stored: Any, depth: int = 0) -> bool:
    """Whether ``stored`` (a class attribute) is a preset's wrapper, or holds one along its
    ``__wrapped__`` chain or in its closure (verl's decorators around the stage): a live patch
    of this process, or a copy of one that cloudpickle brought from another process.

    >>> covered(len), covered(lambda: None)
    (False, False)
    """
    if depth > 6 or stored is None:
        return False
    func = getattr(stored, "__func__", stored)
    try:
        if func in LIVE or stored in LIVE:
            return True
    except TypeError:  # unhashable
        pass
    if isinstance(getattr(func, MARKER, None), str):
        return True
    if covered(getattr(func, "__wrapped__", None), depth + 1):
        return True
    for cell in getattr(func, "__closure__", None) or ():
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(held) and not isinstance(held, type) and covered(held, depth + 1):
            return True
    return False


class SubclassWatch(Installed):
    """The subclasses of ``owner`` whose own ``attr`` overrides the patched one, each patched
    the way the row patched ``owner``: those that exist when it starts, and each one created
    later. Undoing it undoes those patches and, with the last watch on ``owner``, the hook."""

    __slots__ = ("base", "made", "patch_one")

    def __init__(
        self, owner: type, attr: str, patch_one: Callable[[type], Instrumented], label: str
    ) -> None:
        super().__init__(owner, attr, None, None, True, label)
        self.base = owner
        self.installed = self  # what LIVE keys it by; current() says it is still in place
        self.patch_one = patch_one
        self.made: list[Instrumented] = []

    def labels(self) -> tuple[str, ...]:
        """What it has patched so far: ``module:Class.attr`` of each subclass."""
        return tuple(label for h in list(self.made) for label in h.patched)

    def cover(self, cls: type) -> None:
        """Patch each class on ``cls``'s MRO below ``owner`` that defines ``attr`` itself and
        is not covered yet (never wrapped twice, also when it arrived patched by value)."""
        for c in cls.__mro__:
            try:
                below = c is not self.base and issubclass(c, self.base)
            except TypeError:
                below = False
            stored = vars(c).get(self.attr) if below else None
            if stored is None or covered(stored):
                continue
            label = f"{c.__module__}:{c.__qualname__}.{self.attr}"
            try:
                handle = self.patch_one(c)
            except Exception as exc:
                warn_once(
                    ("preset subclass", label),
                    f"could not patch {label}, which overrides {self.label}: {exc}",
                )
                continue
            for patch in handle._patches:
                patch.label = label
                _mark(patch.installed, label)
            handle.patched = tuple(p.label for p in handle._patches)
            self.made.append(handle)

    def current(self) -> Any:
        return self.installed

    def put_back(self) -> None:
        hook = None
        with _watch_lock:
            mine = _watches.get(self.base, [])
            if self in mine:
                mine.remove(self)
            if not mine:
                _watches.pop(self.base, None)
                hook = _hooks.pop(self.base, None)
        while self.made:
            self.made.pop().undo()
        if hook is not None:
            hook.undo()


def _on_new_class(cls: type) -> None:
    try:
        with _watch_lock:
            found = [w for base in cls.__mro__[1:] for w in _watches.get(base, ())]
        for watch in found:
            watch.cover(cls)
    except Exception as exc:  # a class statement must never fail because of us
        warn_once(("preset subclass", repr(cls)), f"could not check {cls!r} for presets: {exc}")


def _subclass_hook(owner: Any, attr: str, raw: Any) -> Any:
    # The hook travels with every class that Ray or multiprocessing pickles by value: its closure
    # holds only picklable things (the owner, by reference; the owner's own Python hook), never
    # `object.__init_subclass__`, a C descriptor that cloudpickle refuses.
    if "__init_subclass__" in vars(owner) and isinstance(raw, classmethod):
        own_hook = raw.__func__

        def __init_subclass__(cls: type, /, **kwargs: Any) -> None:
            own_hook(cls, **kwargs)
            _on_new_class(cls)

    else:

        def __init_subclass__(cls: type, /, **kwargs: Any) -> None:
            super(owner, cls).__init_subclass__(**kwargs)
            _on_new_class(cls)

    return classmethod(__init_subclass__)


def _subclasses(cls: type) -> list[type]:
    found: dict[type, None] = {}
    todo: list[type] = [cls]
    while todo:
        subs: list[type] = type.__subclasses__(todo.pop())
        for sub in subs:
            if sub not in found:
                found[sub] = None
                todo.append(sub)
    return list(found)


def patch_target(
    target: Target, owner: Any, attr: str, options: Options, label: str
) -> Instrumented:
    """Patch ``owner.attr`` with ``target.patch``; when ``owner`` is a class, also each subclass
    that overrides ``attr``, now and when created later (see :class:`SubclassWatch`).

    The handle's ``patched`` names ``label`` and the subclasses patched so far; its undo
    undoes them all, the hook included.

    >>> from mstx_marks import configure
    >>> configure(backend="record")
    >>> class Base:
    ...     def run(self):
    ...         return "base"
    >>> t = Target("demo", __name__, "Base.run", "step", "any")
    >>> handle = patch_target(t, Base, "run", Options(), "demo:Base.run")
    >>> class Late(Base):
    ...     def run(self):
    ...         return "late"
    >>> Late().run(), covered(vars(Late)["run"])
    ('late', True)
    >>> handle.undo()
    >>> covered(vars(Late)["run"]), "__init_subclass__" in vars(Base)
    (False, False)
    """
    handle = target.patch(owner, attr, target, options)
    for patch in handle._patches:
        patch.label = label
        _mark(patch.installed, label)
    patches: list[Installed] = list(handle._patches)
    watch = None
    if isinstance(owner, type):
        with _watch_lock:
            if not any(w.attr == attr for w in _watches.get(owner, ())):

                def patch_one(sub: type) -> Instrumented:
                    return target.patch(sub, attr, target, options)

                watch = SubclassWatch(owner, attr, patch_one, f"{label} (subclasses)")
                _watches.setdefault(owner, []).append(watch)
        if watch is not None:
            LIVE[watch] = watch
            if owner not in _hooks:
                try:
                    _hooks[owner] = replace(owner, "__init_subclass__", _subclass_hook, again=True)
                except Exception as exc:  # a class that refuses it: its subclasses of now only
                    warn_once(
                        ("preset subclass hook", label),
                        f"{label}: subclasses created later are not patched ({exc})",
                    )
            for sub in _subclasses(owner):
                watch.cover(sub)
    parts: list[Instrumented | SubclassWatch] = [Instrumented(patches, ())]
    return combine(parts if watch is None else [*parts, watch], handle.skipped)


def combine(
    parts: Sequence[Instrumented | SubclassWatch], skipped: Iterable[tuple[str, str]] = ()
) -> Instrumented:
    """One handle for several (undone newest first) and ``skipped``; ``patched`` lists what
    each patched, a watch's subclasses (not the watch itself) included."""
    patches: list[Installed] = []
    labels: list[str] = []
    for part in parts:
        for patch in [part] if isinstance(part, SubclassWatch) else part._patches:
            patches.append(patch)
            labels += patch.labels() if isinstance(patch, SubclassWatch) else [patch.label]
    out = Instrumented(patches, list(skipped))
    out.patched = tuple(labels)
    return out
