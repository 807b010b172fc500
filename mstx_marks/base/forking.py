"""What a forked child starts from: fresh locks, then each module's own reset, in one place.

A child made by ``os.fork`` holds one thread: the one that forked. Every other thread of the
parent is gone, yet a lock one of them held at that moment stays held in the child for ever, so
the first ``with lock`` there hangs (a DataLoader's fork workers, a multiprocessing pool, a fork
while our spill thread drains). So every lock of the library is made here (:func:`new_lock`), and
in the child each is made fresh (``_at_fork_reinit``, what CPython's own ``threading`` and
``logging`` use) *before* any reset runs (:func:`after_fork_in_child`), the resets in the order
they were registered: a reset that takes a lock then never waits on a thread that is not there.
The state such a lock guarded may be half-updated; each reset starts its state over rather than
trusting it.

Nothing here keeps an object alive. A lock is held weakly: it lives as long as whoever uses it
(a module's lock with its module, an object's with the object), and a lock no one holds needs no
re-making. A reset that is a bound method (``after_fork_in_child(self.clear)``) is held by a
weak reference to its object (``weakref.WeakMethod``): it runs in a child while the object lives,
and is gone with it. A function is held as given (a module's reset, for the process's life).
Each entry leaves the registry when its lock or object is freed, so a program that makes and
drops objects with locks (a recorder per test, a spill per run) gets its memory back.

>>> lock = new_lock()
>>> with lock:
...     pass
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from types import MethodType
from typing import Any, Callable, Union

__all__ = ["after_fork_in_child", "new_lock"]

#: One order for locks and resets alike (``next`` of a count is atomic under the GIL).
_order = itertools.count()
#: Every live lock, by registration; an entry goes when its lock is freed.
_locks: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_Reset = Union[Callable[[], object], "weakref.WeakMethod[Callable[[], object]]"]
#: Every reset, by registration: a function, or a bound method held weakly (gone with its
#: object, its entry removed by the weak reference's callback).
_resets: dict[int, _Reset] = {}


def new_lock(reentrant: bool = False) -> Any:
    """A ``threading.Lock`` (an ``RLock`` when ``reentrant``) made fresh in a forked child for
    as long as it is used (held weakly here).

    Reentrant where a signal handler may take the lock again on a thread that holds it."""
    lock = threading.RLock() if reentrant else threading.Lock()
    _locks[next(_order)] = lock
    return lock


def after_fork_in_child(reset: Callable[[], object]) -> None:
    """Run ``reset`` in each forked child, after every live lock was made fresh, in the order
    the resets were registered. A reset that raises is skipped: the child carries on.

    A bound method runs only while its object lives, and registering it does not keep the
    object alive (its ``self`` is held weakly); a function is kept for the process's life, and
    so is whatever it holds (a lambda or ``functools.partial`` over an object keeps the object:
    register its method instead)."""
    key = next(_order)
    if isinstance(reset, MethodType):

        def forget(_: object) -> None:
            _resets.pop(key, None)

        try:
            _resets[key] = weakref.WeakMethod(reset, forget)
            return
        except TypeError:  # an object with no weak references (__slots__): kept, as a function
            pass
    _resets[key] = reset


def _in_child() -> None:
    for lock in list(_locks.values()):
        lock._at_fork_reinit()
    for entry in list(_resets.values()):
        reset = entry() if isinstance(entry, weakref.WeakMethod) else entry
        if reset is None:  # its object is being freed
            continue
        try:
            reset()
        except Exception:  # a child must start whatever one module's reset did
            continue


os.register_at_fork(after_in_child=_in_child)
