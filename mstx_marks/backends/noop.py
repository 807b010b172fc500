"""The backend that records nothing: what runs when no tool listens.

The gates never call it while it is selected (a domain whose backend is noop is simply inactive),
but it is a complete backend so that code holding an emitter can always call it.

>>> e = NoopBackend().emitter(None)
>>> e.start("step", "default")
0
"""

from __future__ import annotations

from mstx_marks.backends.base import Backend, Emitter

__all__ = ["NoopBackend"]


def _start(name: str, domain: str) -> int:
    return 0


def _noop(value: object, domain: str) -> None:
    return None


class NoopBackend(Backend):
    """Does nothing, costs nothing."""

    name = "noop"
    emits = False

    def emitter(self, stream: object) -> Emitter:
        return Emitter(self, _start, _noop, _noop)
