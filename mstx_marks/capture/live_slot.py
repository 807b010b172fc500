"""Where a framework's metrics logger meets the live figures of each step, when armed.

A trainer's logger (verl's ``Tracking``) is patched by its preset (this layer), but the figures
it is given (where each step's time went, every process of the job together) are made by
:mod:`mstx_marks.live`, above the analysis, which this layer may not import
(``tests/test_layers.py``). So the preset's wrappers call through this slot: :func:`fill` puts a
factory in it (``mstx_marks.live.arm``, which activation runs when ``MSTX_MARKS_OUT`` and a preset
are set); each logger object gets its own :class:`StepLogger` from it at its first call. With
the slot empty, or the factory giving None, a logger's calls are its own, unchanged.

>>> class Tracking:  # verl.utils.tracking.Tracking's shape
...     def __init__(self):
...         self.logged = []
...     def log(self, data, step, backend=None):
...         self.logged.append((dict(data), step))
>>> class Figures:
...     def log(self, data, step):
...         return [({**data, "mstx/step": step - 1}, step)]
...     def finish(self):
...         return []
>>> fill(Figures)
>>> handle = patch_log(Tracking, "log", None, None)
>>> t = Tracking(); t.log({"loss": 1.0}, step=2); t.logged
[({'loss': 1.0, 'mstx/step': 1}, 2)]
>>> handle.undo(); empty()
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Protocol

from mstx_marks.base.diagnostics import warn_once
from mstx_marks.capture.instrument import Instrumented, replace

__all__ = [
    "StepLogger",
    "empty",
    "fill",
    "flush",
    "patch_finish",
    "patch_fit",
    "patch_log",
    "step_logger",
]

#: A log call to make: its data and its step.
Call = tuple[dict[str, Any], int]


class StepLogger(Protocol):
    """What the slot's factory makes for one logger object."""

    def log(self, data: dict[str, Any], step: int) -> list[Call]:
        """The calls to make instead of ``log(data, step)`` (``data`` and what is ready to go
        with it); must return at once."""
        ...

    def finish(self) -> list[Call]:
        """The calls to make before the logger closes (what is still to log)."""
        ...


_factory: list[Callable[[], StepLogger | None]] = []
#: The attribute a logger object keeps its StepLogger in (None: the factory gave none).
_ATTR = "_mstx_marks_step_logger"


def fill(factory: Callable[[], StepLogger | None]) -> None:
    """Make ``factory`` give each logger object its :class:`StepLogger` (in place of any before).

    >>> fill(lambda: None); step_logger(object()) is None; empty()
    True
    """
    _factory[:] = [factory]


def empty() -> None:
    """Leave the loggers' calls their own."""
    _factory.clear()


def step_logger(owner: Any) -> StepLogger | None:
    """The :class:`StepLogger` of the logger object ``owner``, made at its first call."""
    if not hasattr(owner, "__dict__"):
        return None
    found = owner.__dict__.get(_ATTR, _ATTR)
    if found is _ATTR:
        found = None
        if _factory:
            try:
                found = _factory[0]()
            except Exception as exc:  # a figure is never worth the trainer's log call
                said = f"no live step figures ({type(exc).__name__}: {exc})"
                warn_once(("live", "factory"), said)
        owner.__dict__[_ATTR] = found
    return found  # type: ignore[no-any-return]


def patch_log(owner: Any, attr: str, target: object, options: object) -> Instrumented:
    """A preset row's patch of a logger's ``log(data, step, backend=None)``: with a
    :class:`StepLogger`, the calls it gives are made in its place (``data`` with the figures
    ready, and any older figures first); a call for some backends only is left as it is."""

    def wrap(o: object, a: str, raw: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(raw)
        def log(self: Any, data: Any, step: Any, backend: Any = None) -> Any:
            figures = step_logger(self) if backend is None and isinstance(data, dict) else None
            if figures is None or not isinstance(step, int):
                return raw(self, data, step, backend)
            try:
                calls = figures.log(data, step)
            except Exception as exc:
                warn_once(("live", "log"), f"no live step figures ({type(exc).__name__}: {exc})")
                calls = [(data, step)]
            result = None
            for call_data, call_step in calls:
                result = raw(self, call_data, call_step, backend)
            return result

        return log

    return replace(owner, attr, wrap)


def patch_finish(owner: Any, attr: str, target: object, options: object) -> Instrumented:
    """A preset row's patch of a logger's ``finish(...)``: the figures still to log are logged
    (through its ``log``) before its backends close, once."""

    def wrap(o: object, a: str, raw: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(raw)
        def finish(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(self, "_finished", False):
                flush(self)
            return raw(self, *args, **kwargs)

        return finish

    return replace(owner, attr, wrap)


def patch_fit(owner: Any, attr: str, target: object, options: object) -> Instrumented:
    """A preset row's patch of a trainer's ``fit`` (a coroutine function too): when it ends,
    the figures still to log go through the trainer's logger (``self.logger``), which stays
    open. For trainers that never close their logger (verl's one-step-off and fully async
    trainers keep it until their Ray actor is killed, where no Python code runs)."""

    def wrap(o: object, a: str, raw: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(raw):

            @functools.wraps(raw)
            async def fit_async(self: Any, *args: Any, **kwargs: Any) -> Any:
                try:
                    return await raw(self, *args, **kwargs)
                finally:
                    flush(getattr(self, "logger", None))

            return fit_async

        @functools.wraps(raw)
        def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return raw(self, *args, **kwargs)
            finally:
                flush(getattr(self, "logger", None))

        return fit

    return replace(owner, attr, wrap)


def flush(logger: Any) -> None:
    """Log what ``logger``'s :class:`StepLogger` still holds (its ``finish``), through the
    logger's own ``log``; from then on its calls are its own. Never raises."""
    figures = getattr(logger, "__dict__", {}).get(_ATTR)
    if figures is None:
        return
    logger.__dict__[_ATTR] = None  # (its last calls go straight to the backends)
    try:
        for data, step in figures.finish():
            type(logger).log(logger, data, step)
    except Exception as exc:
        warn_once(("live", "finish"), f"last live step figures not logged ({exc})")
