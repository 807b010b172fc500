"""A write run on a signal, before the handler that was there: :func:`chain_signal`.

What the write may do there is the contract of :mod:`.writer` (a handler runs at any bytecode
boundary of the main thread): ask the writer thread and wait, with a deadline.

>>> import signal
>>> chain_signal(signal.SIGUSR2, lambda previous: None)
>>> signal.getsignal(signal.SIGUSR2).mstx_previous == signal.SIG_DFL
True
>>> _ = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
"""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import Callable

__all__ = ["chain_signal"]


def chain_signal(signum: int, before: Callable[[object], None]) -> None:
    """Run ``before(previous)`` on ``signum``, then ``previous``, the handler installed before
    (dying of the signal when that was the default). ``before`` is told which handler comes
    next, since what it must do depends on it (a handler that raises KeyboardInterrupt may
    leave the process running). Once run, the chain gives the signal back to ``previous``: a
    second signal goes to it directly, never into a write already under way. ``before`` must
    follow the contract of :mod:`.writer`: it runs at any bytecode boundary of the main
    thread."""
    previous = signal.getsignal(signum)
    running: list[int] = []

    def handler(num: int, frame: FrameType | None) -> None:
        if running:
            return  # a second signal during the write: the first one carries on
        running.append(num)
        try:
            before(previous)
        finally:
            running.clear()
        signal.signal(num, previous)
        _run_previous(num, previous, frame)

    handler.mstx_previous = previous  # type: ignore[attr-defined]
    signal.signal(signum, handler)


def _run_previous(num: int, previous: object, frame: FrameType | None) -> None:
    if callable(previous):
        previous(num, frame)
    elif previous == signal.SIG_DFL:
        # Die of the same signal, so the parent sees the usual exit status.
        signal.signal(num, signal.SIG_DFL)
        os.kill(os.getpid(), num)
