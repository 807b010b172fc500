"""The one capture engine: scheduled profiler windows stepped at a loop's iterations.

Both :func:`mstx_marks.profiling.profiler.capture_steps` and every recipe of
:mod:`mstx_marks.profiling.recipes` run on it. A :class:`Stepper` owns a schedule of ``total``
steps and hooks into patched methods (one shared :class:`Site` per method, whoever patches it):

- an *iteration* call is one step of the schedule. With ``boundary="after"`` the profiler steps
  when the call returns (a decode step, a mini-batch's ``train_batch``); with ``"next"`` it steps
  when the next iteration starts and when the loop returns, which is the end of the loop body in
  the framework's source (a micro-batch's ``forward_step`` followed, in the loop, by its backward);
- a *loop* call (``per_call=True``) starts the schedule anew: a new profiler, a new window, in
  every call of the loop's function, as a profiler built in that function would. Without loops
  the schedule runs once per process.

The profiler is built at the first counted iteration of a window and stopped when the window's
steps are done (or the loop returns, or the stepper is undone). Only one window runs at a time in
a process (torch allows one profiler): an iteration that finds another stepper's window running
is not counted. ``strict`` steppers (``capture_steps``) raise profiler errors into the caller and
stop at a failing call; the others (recipes) warn once, disarm, and count a failing call.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple, Optional

from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.forking import new_lock
from mstx_marks.capture.instrument import Instrumented, replace
from mstx_marks.core.engine import rewrap

__all__ = ["Schedule", "Site", "Stepper", "Window", "hook_into", "running"]

_lock = new_lock(reentrant=True)
#: The one window whose profiler exists now.
_running: Optional[Window] = None


def running() -> Optional[Window]:
    """The window whose profiler runs in this process, if any."""
    return _running


class Schedule(NamedTuple):
    """torch's schedule: ``skip_first``, then ``(wait, warmup, active)`` x ``repeat``."""

    wait: int = 0
    warmup: int = 0
    active: int = 1
    repeat: int = 1
    skip_first: int = 0

    @property
    def total(self) -> int:
        """The steps after which the window is done."""
        return self.skip_first + (self.wait + self.warmup + self.active) * self.repeat


class Window:
    """One profiler run: built and started by :meth:`open`, stepped, stopped by :meth:`close`."""

    def __init__(self, total: int, context: Any = None) -> None:
        self.total = total
        self.context = context
        self.steps = 0
        self.profiler: Any = None
        self.done = False

    def open(self, build: Callable[[Any], Any]) -> bool:
        """Build and start the profiler (False: another window runs). Raises what build/start
        raise; a profiler that failed to start is never stopped."""
        global _running
        with _lock:
            if _running is not None and _running is not self:
                return False
            if self.profiler is not None:
                return True
            _running = self
        try:
            profiler = build(self.context)
            profiler.start()
        except BaseException:
            self._release()
            self.done = True
            raise
        self.profiler = profiler
        return True

    def step(self) -> None:
        """One step; the last one closes the window."""
        self.steps += 1
        self.profiler.step()
        if self.steps >= self.total:
            self.close()

    def close(self) -> None:
        """Stop the profiler (what it holds is written). Idempotent; raises what stop raises."""
        if self.done:
            return
        self.done = True
        profiler, self.profiler = self.profiler, None
        try:
            if profiler is not None:
                profiler.stop()
        finally:
            self._release()

    def _release(self) -> None:
        global _running
        with _lock:
            if _running is self:
                _running = None


# --- patched methods, shared ----------------------------------------------------------------


class Hook:
    """What a site calls around each call: ``enter`` returns a token (None: not taken), and
    ``exit(token, error)`` runs after the call for each token taken, in reverse order."""

    order = 1

    def enter(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def exit(self, token: Any, error: Optional[BaseException]) -> None:
        raise NotImplementedError


class Site:
    """One patched method (or function) and the hooks that watch its calls."""

    def __init__(self, key: tuple[int, str]) -> None:
        self.key = key
        self.hooks: tuple[Hook, ...] = ()
        self.handle: Optional[Instrumented] = None


_sites: dict[tuple[int, str], Site] = {}


def _enter_all(hooks: Sequence[Hook], args: Any, kwargs: Any) -> list[tuple[Hook, Any]]:
    entered: list[tuple[Hook, Any]] = []
    try:
        for hook in hooks:
            token = hook.enter(args, kwargs)
            if token is not None:
                entered.append((hook, token))
    except BaseException as exc:  # a strict hook refused: undo those entered, then raise
        _exit_all(entered, exc)
        raise
    return entered


def _exit_all(entered: list[tuple[Hook, Any]], error: Optional[BaseException]) -> None:
    first: Optional[BaseException] = None
    for hook, token in reversed(entered):
        try:
            hook.exit(token, error)
        except BaseException as exc:  # only strict hooks raise; the first one wins
            first = first or exc
    if first is not None and error is None:
        raise first


def _wrap(site: Site, inner: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(inner)  # keeps verl's `register` attribute (in __dict__) and __wrapped__
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        hooks = site.hooks
        if not hooks:
            return inner(*args, **kwargs)
        entered = _enter_all(hooks, args, kwargs)
        try:
            result = inner(*args, **kwargs)
        except BaseException as exc:
            _exit_all(entered, exc)
            raise
        _exit_all(entered, None)
        return result

    return wrapper


def hook_into(owner: Any, attr: str, hook: Hook) -> Site:
    """Add ``hook`` to the calls of ``owner.attr`` (patched once, whoever asks)."""
    key = (id(owner), attr)
    with _lock:
        site = _sites.get(key)
        if site is None:
            site = Site(key)
            # again=True: a method a preset already wraps in ranges is captured with its ranges.
            site.handle = replace(
                owner, attr, lambda o, a, raw: rewrap(raw, functools.partial(_wrap, site)),
                again=True,
            )  # fmt: skip
            _sites[key] = site
        if hook not in site.hooks:
            site.hooks = tuple(sorted((*site.hooks, hook), key=lambda h: h.order))
        return site


def unhook(site: Site, hook: Hook) -> None:
    """Remove ``hook``; the last one out restores the method."""
    with _lock:
        site.hooks = tuple(h for h in site.hooks if h is not hook)
        if not site.hooks:
            if site.handle is not None:
                site.handle.undo()
            _sites.pop(site.key, None)


# --- the stepper ----------------------------------------------------------------------------

#: ``(tag, args, kwargs)`` of a loop call -> its window's context, or None: not captured.
LoopFilter = Callable[[str, tuple[Any, ...], dict[str, Any]], Any]
#: ``(tag, args, kwargs, context)`` of an iteration -> its context, or None: not counted.
IterationFilter = Callable[[str, tuple[Any, ...], dict[str, Any], Any], Any]


class _Run:
    """One call of a loop (or, without loops, the process): its window and a pending step."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.window: Optional[Window] = None
        self.pending = False


class _LoopHook(Hook):
    def __init__(self, stepper: Stepper, tag: str) -> None:
        self.stepper, self.tag = stepper, tag

    def enter(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.stepper._loop_enter(self.tag, args, kwargs)

    def exit(self, token: Any, error: Optional[BaseException]) -> None:
        self.stepper._loop_exit(token)


class _IterationHook(Hook):
    order = 2  # after the loop hooks of the same method (a loop that is its own iteration)

    def __init__(self, stepper: Stepper, tag: str, boundary: str) -> None:
        self.stepper, self.tag, self.boundary = stepper, tag, boundary

    def enter(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.stepper._iteration_enter(self, args, kwargs)

    def exit(self, token: Any, error: Optional[BaseException]) -> None:
        self.stepper._iteration_exit(self, token, error)


class Stepper:
    """A schedule stepped at the iterations of one loop, in windows; see the module doc.

    ``build(context)`` makes a window's profiler. ``label`` wraps each counted call in a
    ``record_function`` range ``"{label}#{k}"``. ``on_done`` runs once when the stepper ends
    (after its hooks are removed). ``name`` is what warnings call it.
    """

    def __init__(
        self,
        schedule: Schedule,
        build: Callable[[Any], Any],
        *,
        name: str,
        per_call: bool = False,
        strict: bool = False,
        label: Optional[str] = None,
        loop_filter: Optional[LoopFilter] = None,
        iteration_filter: Optional[IterationFilter] = None,
        on_done: Optional[Callable[[], None]] = None,
    ) -> None:
        self.schedule, self.total = schedule, schedule.total
        self.build, self.name = build, name
        self.per_call, self.strict, self.label = per_call, strict, label
        self.loop_filter = loop_filter or (lambda tag, args, kwargs: tag)
        self.iteration_filter = iteration_filter or (lambda tag, args, kwargs, ctx: ctx or tag)
        self.on_done = on_done
        self.done = False
        self.windows: list[Window] = []  # every window opened, newest last
        self._process = _Run(None)
        self._sites: list[tuple[Site, Hook]] = []
        self._local = threading.local()

    # -- attaching ---------------------------------------------------------------------------

    def add_loop(self, owner: Any, attr: str, tag: str = "") -> None:
        """Each call of ``owner.attr`` starts the schedule anew."""
        self._add(owner, attr, _LoopHook(self, tag))

    def add_iteration(self, owner: Any, attr: str, tag: str = "", boundary: str = "after") -> None:
        """Each call of ``owner.attr`` is one step (``boundary``: "after" or "next")."""
        if boundary not in ("after", "next"):
            raise ValueError(f"boundary {boundary!r} must be 'after' or 'next'")
        self._add(owner, attr, _IterationHook(self, tag, boundary))

    def _add(self, owner: Any, attr: str, hook: Hook) -> None:
        with _lock:
            if not self.done:
                self._sites.append((hook_into(owner, attr, hook), hook))

    # -- loops -------------------------------------------------------------------------------

    def _stack(self) -> list[_Run]:
        stack: Optional[list[_Run]] = getattr(self._local, "runs", None)
        if stack is None:
            stack = self._local.runs = []
        return stack

    def _loop_enter(self, tag: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.done:
            return None
        try:
            context = self.loop_filter(tag, args, kwargs)
        except Exception as exc:
            return self._fail("could not read a loop call", exc)
        run = _Run(context) if context is not None else None
        self._stack().append(run)  # type: ignore[arg-type]  # None: a loop not captured
        return self._stack

    def _loop_exit(self, token: Any) -> None:
        stack = self._stack()
        run = stack.pop() if stack else None
        if run is None or run.window is None or run.window.done:
            return
        try:
            if run.pending:
                run.window.step()  # the end of the last iteration's loop body
        except Exception as exc:
            self._fail("the profiler failed to step", exc)
        finally:
            self._close(run.window)

    # -- iterations --------------------------------------------------------------------------

    def _current(self) -> Optional[_Run]:
        if not self.per_call:
            return self._process
        stack = self._stack()
        return stack[-1] if stack else None

    def _iteration_enter(
        self, hook: _IterationHook, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        run = self._current()
        if self.done or run is None or getattr(self._local, "inside", False):
            return None  # not in a captured loop, or a patched override calling its base
        try:
            context = self.iteration_filter(hook.tag, args, kwargs, run.context)
            if context is None:
                return None
            if run.window is None:
                run.context = context
                run.window = Window(self.total, context)
            window = run.window
            if window.done or not window.open(self.build):
                return None
            if window not in self.windows:
                self.windows.append(window)
            if hook.boundary == "next" and run.pending:
                run.pending = False
                window.step()
                if window.done:
                    return None
        except Exception as exc:
            if self.strict:
                self.finish()
                raise
            return self._fail("the profiler could not be built, started or stepped", exc)
        self._local.inside = True
        return (run, self._range(window.steps))

    def _iteration_exit(
        self, hook: _IterationHook, token: Any, error: Optional[BaseException]
    ) -> None:
        self._local.inside = False
        run, rng = token
        if rng is not None:
            with contextlib.suppress(Exception):
                rng.__exit__(None, None, None)
        if error is not None and self.strict:
            self.finish()  # capture_steps: a failing call ends the capture
            return
        window = run.window
        if window is None or window.done:
            return
        try:
            if hook.boundary == "next":
                run.pending = True
            else:
                window.step()
        except Exception as exc:
            if self.strict:
                self.finish()
                raise
            self._fail("the profiler failed to step", exc)
            return
        if window.done:
            self._closed(window)

    def _range(self, k: int) -> Any:
        if self.label is None:
            return None
        from torch.profiler import record_function

        rng = record_function(f"{self.label}#{k}")
        rng.__enter__()  # type: ignore[no-untyped-call]
        return rng

    # -- ending ------------------------------------------------------------------------------

    def _close(self, window: Window) -> None:
        try:
            window.close()
        except Exception as exc:
            if self.strict:
                raise
            warn_once(
                ("stepper stop", self.name),
                f"{self.name}: the profiler failed to stop ({type(exc).__name__}: {exc})",
            )
        self._closed(window)

    def _closed(self, window: Window) -> None:
        """A window ended: without loops, the stepper ends with it."""
        if not self.per_call:
            self.finish()

    def _fail(self, what: str, exc: BaseException) -> None:
        warn_once(
            ("stepper failed", self.name),
            f"{self.name}: {what} ({type(exc).__name__}: {exc});"
            " it is disarmed and the job runs on",
        )
        with contextlib.suppress(Exception):
            self.finish()

    def open_windows(self) -> list[Window]:
        """The windows whose profiler runs now (at most one)."""
        return [w for w in self.windows if not w.done and w.profiler is not None]

    def finish(self) -> None:
        """Stop a running window (what it recorded is written), restore every patched method,
        run ``on_done``. Idempotent."""
        with _lock:
            if self.done:
                return
            self.done = True
            sites, self._sites = self._sites, []
        try:
            for window in self.open_windows():
                self._close(window)
        finally:
            for site, hook in sites:
                unhook(site, hook)
            if self.on_done is not None:
                self.on_done()
