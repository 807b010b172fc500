"""What a forked child starts from: fresh locks, then each module's own reset, in one place.

A child made by ``os.fork`` holds one thread: the one that forked. Every other thread of the
parent is gone, yet a lock one of them held at that moment stays held in the child for ever, so
the first ``with lock`` there hangs (a DataLoader's fork workers, a multiprocessing pool, a fork
while our spill thread drains). So every lock of the library is made here (:func:`new_lock`), and
in the child each is made fresh (``_at_fork_reinit``, what CPython's own ``threading`` and
``logging`` use) *before* any module's reset runs (:func:`after_fork_in_child`): a reset that
takes a lock then never waits on a thread that is not there. The state such a lock guarded may
be half-updated; each reset starts its state over rather than trusting it.

>>> lock = new_lock()
>>> with lock:
...     pass
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

__all__ = ["after_fork_in_child", "new_lock"]

_locks: list[Any] = []
_resets: list[Callable[[], object]] = []


def new_lock(reentrant: bool = False) -> Any:
    """A ``threading.Lock`` (an ``RLock`` when ``reentrant``) made fresh in a forked child.

    Reentrant where a signal handler may take the lock again on a thread that holds it."""
    lock = threading.RLock() if reentrant else threading.Lock()
    _locks.append(lock)
    return lock


def after_fork_in_child(reset: Callable[[], object]) -> None:
    """Run ``reset`` in each forked child, after every lock was made fresh, in the order the
    resets were registered. A reset that raises is skipped: the child carries on."""
    _resets.append(reset)


def _in_child() -> None:
    for lock in _locks:
        lock._at_fork_reinit()
    for reset in list(_resets):
        try:
            reset()
        except Exception:  # a child must start whatever one module's reset did
            continue


os.register_at_fork(after_in_child=_in_child)
