"""The one way tests run code on several threads: start them all, join with a time limit, and
re-raise the first exception a thread hit (a bare Thread would only print it)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any, Callable


def run_threads(
    target: Callable[..., Any], args: Iterable[Sequence[Any]], timeout: float = 60.0
) -> None:
    """Run ``target(*a)`` for each ``a`` in ``args`` on its own thread, all at once."""
    errors: list[BaseException] = []

    def guarded(*a: Any) -> None:
        try:
            target(*a)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=tuple(a)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        raise TimeoutError(f"threads {stuck} still running after {timeout} s")
    if errors:
        raise errors[0]
