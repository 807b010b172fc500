"""The class a framework actually builds for its hot path, checked when it is built.

A preset's rows name the classes that define the methods they wrap, and cover the subclasses
that override them. The framework may run another class all the same: vllm-ascend's
``NPUWorker`` derives from vLLM's ``WorkerBase``, beside ``Worker``, and overrides
``execute_model``; a platform plugin or a user's own worker does the same. "The preset patched
something" then hides that the running class is not marked. So each preset also names where its
framework builds that object (:class:`Built`): vLLM's ``WorkerWrapperBase.init_worker`` (the
``worker_cls`` the platform chose), SGLang's ``ModelRunner.__init__``, verl's
``Worker.__init__``. Right after it, the object's class is looked up for the preset's hot
methods; one that no range wraps is said at once, in that process, once per class: the class,
its module, its package's version, and the setting that covers it (or the call that marks it).
The same finding is recorded as an instant named ``uncovered <module>:<Class>.<method>`` in
domain ``mstx_marks``, so that ``mstx-marks coverage`` names it from the files.

>>> class Base:
...     def step(self): ...
>>> class Runner(Base):
...     def step(self): ...
>>> uncovered_methods(Runner, ("step", "absent"))
['step']
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, NamedTuple

from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.forking import new_lock
from mstx_marks.capture.instrument import Instrumented, replace
from mstx_marks.capture.presets.target import covered
from mstx_marks.core.ranges import instant

__all__ = ["DOMAIN", "Built", "uncovered_methods", "watch_built"]

#: The domain of the ``uncovered ...`` instants.
DOMAIN = "mstx_marks"


class Built(NamedTuple):
    """Where ``framework`` builds its hot-path object: after ``module``'s ``path``
    (``Class.method``) returns, ``built(self, result)`` is that object, and each of ``methods``
    that its class has must be wrapped by a range."""

    framework: str
    module: str
    path: str
    methods: tuple[str, ...]
    built: Callable[[Any, Any], Any] = lambda self, result: self


def _stored(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return None


def uncovered_methods(cls: type, methods: tuple[str, ...]) -> list[str]:
    """Those of ``methods`` that ``cls`` has (own or inherited) and no preset wraps."""
    return [m for m in methods if (s := _stored(cls, m)) is not None and not covered(s)]


def _owner(cls: type, name: str) -> type:
    return next((k for k in cls.__mro__ if name in vars(k)), cls)


def _version(module: str) -> str:
    from importlib import metadata

    top = module.partition(".")[0]
    with contextlib.suppress(Exception):
        for dist in metadata.packages_distributions().get(top, ()):
            return f"{dist} {metadata.version(dist)}"
    return f"{top} (version unknown)"


_seen: set[type] = set()
_seen_lock = new_lock()


def _check(row: Built, obj: Any, covering: Callable[[str, str], str]) -> None:
    cls = type(obj)
    with _seen_lock:
        if cls in _seen:
            return
        _seen.add(cls)
    missing = uncovered_methods(cls, row.methods)
    if not missing:
        return
    labels = []
    for method in missing:
        owner = _owner(cls, method)
        label = f"{owner.__module__}:{owner.__qualname__}.{method}"
        labels.append(label)
        instant(f"uncovered {label}", domain=DOMAIN)
    first = _owner(cls, missing[0])
    warn_once(
        ("uncovered", cls),
        f"{row.framework} preset: {', '.join(labels)} ({_version(first.__module__)}) is not"
        f" marked, though {cls.__module__}:{cls.__qualname__} is the class this process runs;"
        f" {covering(first.__module__, f'{first.__qualname__}.{missing[0]}')}",
    )


def watch_built(row: Built, owner: Any, covering: Callable[[str, str], str]) -> Instrumented:
    """Patch ``owner``'s ``row.path`` method so that the object it builds is checked once per
    class (module docstring). ``covering(module, path)`` says what covers a missing method.
    The check never raises into the framework."""

    def wrap(o: object, attr: str, raw: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(raw)
        def building(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = raw(self, *args, **kwargs)
            try:
                _check(row, row.built(self, result), covering)
            except Exception as exc:  # a framework's object we cannot read: say so, carry on
                warn_once(("built check", row.path), f"could not check {row.path}'s class ({exc})")
            return result

        return building

    return replace(owner, row.path.rpartition(".")[2], wrap)
