"""The hard off switch: ``mark``, ``mstx_range`` and ``instant`` under ``MSTX_MARKS_OFF=1``.

Read once, when :mod:`mstx_marks` is imported. Then ``mstx_range`` returns the function itself
(a call costs exactly a bare call), ``mark`` returns one shared object whose ``with`` does
nothing, ``instant`` does nothing, and no preset patches anything. Unlike ``MSTX_MARKS_DISABLE``
(which ``configure(enabled=True)`` undoes), nothing can switch ranges on later in that process:
the functions that would have emitted them were never built. ``mark(name, timing=...)`` still
adds the block's seconds to ``timing[name]``, since programs read those (verl's ``timing_raw``).
Names are not checked: the switch skips all the library's work, checks included.

>>> @mstx_range("update_actor")
... def update():
...     return 1
>>> update.__name__, update()
('update', 1)
>>> with mark("step"):
...     instant("tick")
"""

from __future__ import annotations

from collections.abc import MutableMapping
from time import perf_counter
from typing import Any, Callable, TypeVar

from mstx_marks.base.phases import Phase

__all__ = ["NOOP_MARK", "instant", "mark", "mstx_range"]

F = TypeVar("F", bound=Callable[..., Any])


class _NoopRange:
    __slots__ = ()

    def end(self) -> None:
        """Nothing to end."""


_NOOP_RANGE = _NoopRange()


class _NoopMark:
    """A ``with`` that does nothing and a decorator that returns the function itself."""

    __slots__ = ()
    name = ""
    domain = "default"

    def __enter__(self) -> _NoopMark:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def __call__(self, func: F) -> F:
        return func

    def start(self, *, sampled: bool = True) -> _NoopRange:
        return _NOOP_RANGE

    def wrap(self, func: F) -> F:
        return func

    def __repr__(self) -> str:
        return "<mstx_marks: off (MSTX_MARKS_OFF)>"


#: The one object every ``mark()`` returns while the switch is off.
NOOP_MARK = _NoopMark()


class _TimedOnly:
    __slots__ = ("_name", "_t0", "_timing")

    def __init__(self, name: Any, timing: MutableMapping[str, float]) -> None:
        self._name = str(getattr(name, "name", name))
        self._timing, self._t0 = timing, 0.0

    def __enter__(self) -> _TimedOnly:
        self._t0 = perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        t = self._timing
        t[self._name] = t.get(self._name, 0.0) + (perf_counter() - self._t0)


def mark(name: Any, *, timing: MutableMapping[str, float] | None = None, **_: Any) -> Any:
    """:func:`mstx_marks.mark` switched off: the shared no-op (or a timer, with ``timing``)."""
    return NOOP_MARK if timing is None else _TimedOnly(name, timing)


def mstx_range(name: Any = None, /, **_: Any) -> Any:
    """:func:`mstx_marks.mstx_range` switched off: the function itself, undecorated."""
    if name is None or isinstance(name, (str, Phase)):
        return NOOP_MARK  # @mstx_range("name", ...): the decorator that returns the function
    return name  # bare @mstx_range: the function (or staticmethod, classmethod) itself


def instant(name: Any, **_: Any) -> None:
    """:func:`mstx_marks.instant` switched off."""
