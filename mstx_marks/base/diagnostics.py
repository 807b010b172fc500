"""How the library speaks to the user: one warning category, pointed at the user's own line.

Every warning mstx_marks gives is a :class:`MstxMarksWarning`, so one filter silences or
escalates them all, and each names the line of user code that led to it rather than a line
inside the library. A warning never raises into the workload: under ``python -W error`` (or a
filter that turns ours into errors) it is printed to stderr instead, because the code that
warns is often the hot path of a range start.

>>> import warnings
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     warn("something degraded")
>>> caught[0].category.__name__, str(caught[0].message)
('MstxMarksWarning', 'mstx_marks: something degraded')
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Hashable
from types import FrameType

from mstx_marks.base.forking import new_lock

__all__ = ["MstxMarksWarning", "counted", "forget_warnings", "warn", "warn_once"]

# The package folder (this file is in base/): frames under it are ours, not the user's.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# `with mark(...)` reached through ExitStack runs our code from contextlib's frames; a thread of
# ours (the spill's) starts from threading's, which are no line of the user's either.
_CONTEXTLIB = contextlib.__file__
_THREADING = threading.__file__
_said: set[Hashable] = set()
# Reentrant: a signal handler that warns may interrupt its own thread holding it.
_said_lock = new_lock(reentrant=True)


class MstxMarksWarning(UserWarning):
    """The category of every warning mstx_marks gives.

    Silence them with ``-W ignore::mstx_marks.MstxMarksWarning``.
    """


def _ours(filename: str) -> bool:
    # `<frozen site>`, `<frozen runpy>`, `<frozen importlib._bootstrap>`: the interpreter's own
    # start-up and import machinery (the launcher's sitecustomize, an import hook) is no line of
    # the user's either.
    return (
        filename.startswith(_PACKAGE_DIR)
        or filename in (_CONTEXTLIB, _THREADING)
        or filename.startswith("<frozen ")
    )


def _user_stacklevel() -> int | None:
    """The ``stacklevel`` for ``warnings.warn`` called from :func:`warn` that lands on the first
    frame outside this package (wrappers, contextlib, the library's own layers and the
    interpreter's frozen start-up and import frames skipped); None when there is none (a
    process's start-up, an exit hook, a thread of ours)."""
    level = 2  # warn()'s caller
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and _ours(frame.f_code.co_filename):
        # warnings.warn skips the import machinery's frames itself when it counts the level:
        # counted here too, a warning said while `import mstx_marks` runs landed on `sys:1`.
        if not _skipped_by_warnings(frame.f_code.co_filename):
            level += 1
        frame = frame.f_back
    return None if frame is None else level


def _skipped_by_warnings(filename: str) -> bool:
    # What warnings._is_internal_frame skips (CPython 3.9 to 3.13).
    return "importlib" in filename and "_bootstrap" in filename


def warn(message: str, category: type[Warning] = MstxMarksWarning) -> None:
    """Warn ``mstx_marks: message`` at the user's line; never raise, whatever the filters.

    With no user line on the stack the warning names ``<mstx_marks>`` rather than a frame of
    the interpreter's (``<frozen site>:548``) or ``sys:1``.
    """
    text = message if message.startswith("mstx_marks: ") else f"mstx_marks: {message}"
    try:
        level = _user_stacklevel()
        if level is None:
            warnings.warn_explicit(text, category, "<mstx_marks>", 0)
        else:
            warnings.warn(text, category, stacklevel=level)
    except Exception:  # -W error, or a filter that raises: still say it, but do not break
        with contextlib.suppress(Exception):
            print(f"{category.__name__}: {text}", file=sys.stderr)


def warn_once(key: Hashable, message: str, category: type[Warning] = MstxMarksWarning) -> None:
    """:func:`warn`, the first time ``key`` is seen in this process only."""
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    warn(message, category)


def forget_warnings() -> None:
    """Let every :func:`warn_once` speak again. For tests."""
    with _said_lock:
        _said.clear()


def counted(n: int, one: str, many: str = "") -> str:
    """``n`` things in words, the noun agreeing: ``1 process``, ``2 processes``.

    >>> counted(1, "process", "processes"), counted(3, "rank"), counted(0, "step")
    ('1 process', '3 ranks', '0 steps')
    """
    return f"{n} {one if n == 1 else (many or one + 's')}"
