"""Arming a recipe in this process (:func:`capture`, :func:`arm_from_text`) and what runs then: a
:class:`Capture` hooks the recipe's calls when their modules are imported, and builds each
window's profiler (:mod:`mstx_marks.profiling.windows` steps it).

>>> handle = capture("rollout_decode", wait=1, active=2)
>>> [c.recipe.name for c in armed()], handle.total
(['rollout_decode'], 3)
>>> handle.undo()
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import sys
from collections.abc import Sequence
from types import ModuleType, TracebackType
from typing import Any, NamedTuple, Optional, Union

from mstx_marks.base import env
from mstx_marks.base.checks import check_bool, check_int, check_ints
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.forking import new_lock
from mstx_marks.base.import_hooks import when_imported
from mstx_marks.core.process import PROCESS
from mstx_marks.profiling.profiler import experimental_config
from mstx_marks.profiling.recipes.parse import parse_entry
from mstx_marks.profiling.recipes.rows import BY_NAME, DEFAULT_OUT, Recipe, Target, owner
from mstx_marks.profiling.recipes.verl_calls import (
    VERL_WARNING,
    arm_stages,
    backend,
    cannot_attach,
    count,
    forward_only,
    pipeline_size,
    running_stages,
    verl_profiler_on,
    verl_role,
)
from mstx_marks.profiling.windows import Schedule, Stepper

__all__ = ["Capture", "arm_from_text", "armed", "capture"]

_lock = new_lock(reentrant=True)
#: The captures armed in this process and not done (kept on the process's state).
_armed: list[Capture] = PROCESS.captures  # type: ignore[assignment]


class _Context(NamedTuple):
    """What one window is: its folder, and who runs it."""

    folder: str
    role: str
    step: Optional[int]
    workers: tuple[object, ...]


def _safe(word: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", word) or "python"


class Capture:
    """An armed recipe in this process: what :func:`capture` returns.

    ``counted`` is the iterations profiled so far (all windows), ``windows`` the windows
    opened, ``folders`` their trace folders (``save_path`` the newest, ``role`` its role),
    ``total`` one window's schedule length; ``done`` is True once the recipe was undone, its
    last chosen step passed, its one window (decode steps) ended, or it disarmed itself. Also a
    context manager that undoes on exit.
    """

    def __init__(self, recipe: Recipe, options: dict[str, Any]) -> None:
        self.recipe = recipe
        self.options = options
        self.wait: int = options["wait"]
        self.warmup: int = options["warmup"]
        self.active: int = options["active"]
        self.repeat: int = options["repeat"]
        self.skip_first: int = options["skip_first"]
        self.level: str = options["level"]
        self.export: Union[str, list[str]] = options["export"]
        self.out: str = options["out"]
        self.steps: tuple[int, ...] = options["steps"]
        self.role_filter: Optional[str] = options["role"]
        self.role: Optional[str] = None
        self.save_path: Optional[str] = None
        self.folders: list[str] = []
        schedule = Schedule(
            options["wait"], options["warmup"], options["active"], options["repeat"],
            options["skip_first"],
        )  # fmt: skip
        self.stepper = Stepper(
            schedule, self._build, name=f"recipe {recipe.name}",
            per_call=any(t.kind == "loop" for t in recipe.targets),
            loop_filter=self._loop_context, iteration_filter=self._iteration_context,
            on_done=self._forget,
        )  # fmt: skip
        self.total = self.stepper.total

    @property
    def done(self) -> bool:
        return self.stepper.done

    @property
    def counted(self) -> int:
        return sum(w.steps for w in self.stepper.windows)

    @property
    def windows(self) -> int:
        return len(self.stepper.windows)

    def _attach(self, target: Target, module: ModuleType) -> None:
        """Runs when ``target.module`` is imported: hook the call in."""
        if self.done:
            return
        found = owner(module, target)
        if found is None:
            warn_once(
                ("recipe target", self.recipe.name, target.module, target.path),
                f"recipe {self.recipe.name}: {target.module} has no {target.path} (it is in"
                f" {self.recipe.frameworks}); nothing is captured there",
            )
            return
        attr = target.path.rpartition(".")[2]
        if target.kind == "loop":
            self.stepper.add_loop(found, attr, target.tag)
        else:
            self.stepper.add_iteration(found, attr, target.tag, target.boundary)

    def _loop_context(self, tag: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A loop call's window (None: this call is not captured)."""
        obj = args[0] if args else None
        if not self.recipe.roles:
            return self._context(self.recipe.folder.format(tag=tag), "", None, ())
        wanted = self.recipe.forward_only
        if (
            wanted is not None
            and tag in ("fsdp", "megatron")
            and (forward_only(args, kwargs, False) is not wanted)
        ):
            return None
        role = verl_role(obj)
        if role not in self.recipe.roles or self.role_filter not in (None, role):
            return None
        stages = running_stages()
        step = stages[-1].step if stages else count(obj, f"{self.recipe.name} loop")
        if self.steps and step not in self.steps:
            self._maybe_finish(step)
            return None
        where = backend(obj, tag)
        if self.recipe.name == "update_micro_batch" and not self._micro_ok(obj, where):
            return None
        folder = self.recipe.folder.format(role=role, Role=role.capitalize(), backend=where)
        return self._context(folder, role, step, (*(s.worker for s in stages), obj))

    def _micro_ok(self, engine: object, where: str) -> bool:
        size = pipeline_size(engine) if where == "megatron" else 1
        if size > 1:
            warn_once(
                ("recipe pipeline", self.recipe.name),
                f"recipe {self.recipe.name}: verl's Megatron engine runs pipeline parallel"
                f" (size {size}), whose 1F1B schedule interleaves micro-batches inside"
                " megatron-core: no window holds one micro-batch's forward and backward, so"
                " nothing is captured; use update_mini_batch",
            )
        return size == 1

    def _maybe_finish(self, step: int) -> None:
        if step > max(self.steps):
            self.stepper.finish()  # every chosen step is behind: restore the methods

    def _iteration_context(
        self, tag: str, args: tuple[Any, ...], kwargs: dict[str, Any], context: Any
    ) -> Any:
        if context is not None:
            return context
        return self._context(self.recipe.folder.format(tag=tag), "", None, ())

    def _context(
        self, folder: str, role: str, step: Optional[int], workers: tuple[Any, ...]
    ) -> _Context:
        return _Context(os.path.join(self.out, _safe(folder)), role, step, workers)

    def _build(self, context: _Context) -> Any:
        """A window's profiler (the stepper builds it at the window's first iteration)."""
        if self.recipe.stages and any(map(verl_profiler_on, context.workers)):
            warn_once(("recipe verl profiler", self.recipe.name), VERL_WARNING)
        from mstx_marks.profiling import profiler

        o = self.options
        self.role, self.save_path = context.role or None, context.folder
        self.folders.append(context.folder)
        built = profiler.build_profiler(
            contents=self._contents(), level=o["level"], analysis=o["analyse"],
            export=o["export"], save_path=context.folder, wait=o["wait"], warmup=o["warmup"],
            active=o["active"], repeat=o["repeat"], skip_first=o["skip_first"],
        )  # fmt: skip
        if not o["analyse"]:
            _print_offline_line(self.recipe.name, context.folder)
        return built

    def _contents(self) -> tuple[str, ...]:
        o = self.options
        flags = (
            ("shapes", "record_shapes"),
            ("module", "with_modules"),
            ("memory", "profile_memory"),
        )
        extra = tuple(word for word, key in (*flags, ("stack", "with_stack")) if o[key])
        return ("npu", "cpu", *extra)

    def _forget(self) -> None:
        with _lock:
            if self in _armed:
                _armed.remove(self)

    def undo(self) -> None:
        """Disarm: stop the profiler if it runs (what it recorded is written), restore the
        patched methods. Any number of calls.

        >>> handle = capture("update_mini_batch", active=2)
        >>> handle.undo(); handle.undo()
        >>> handle.done, handle.counted
        (True, 0)
        """
        self.stepper.finish()

    def __enter__(self) -> Capture:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.undo()

    def __repr__(self) -> str:
        return (
            f"Capture({self.recipe.name!r}, wait={self.wait}, warmup={self.warmup},"
            f" active={self.active}, repeat={self.repeat}, windows={self.windows},"
            f" done={self.done})"
        )


_printed: set[str] = set()


def _print_offline_line(recipe: str, folder: str) -> None:
    """analyse=False: the data is written unparsed; say once per folder how to parse it."""
    if folder in _printed:
        return
    _printed.add(folder)
    print(
        f"mstx_marks: recipe {recipe} writes unparsed profiler data to {folder}; parse it"
        ' offline with: python -c "from torch_npu.profiler.profiler import analyse;'
        f" analyse(profiler_path='{folder}')\"",
        file=sys.stderr,
    )


def _check_out(out: object) -> str:
    if out is None:
        out = env.text(env.OUT) or DEFAULT_OUT
    if isinstance(out, os.PathLike):
        out = os.fspath(out)
    if not isinstance(out, str):
        raise TypeError(f"out must be a str or a path, got {type(out).__name__} {out!r}")
    if not out.strip():
        raise ValueError(f"out must be a non-empty folder name, got {out!r}")
    return os.path.abspath(out)


def _check_options(recipe: Recipe, options: dict[str, Any]) -> dict[str, Any]:
    """Every option checked now: a wrong type is a TypeError, a bad value a ValueError."""
    o = dict(options)
    for key in ("wait", "warmup", "skip_first"):
        o[key] = check_int(o[key], key)
    o["active"] = check_int(o["active"], "active", 1)
    o["repeat"] = check_int(o["repeat"], "repeat", 1)
    for key in ("record_shapes", "with_modules", "profile_memory", "with_stack", "analyse"):
        o[key] = check_bool(o[key], key)
    export = o["export"]
    if not isinstance(export, str):
        o["export"] = list(export) if isinstance(export, Sequence) else export
    # What build_profiler checks later (level, export), now; mstx_supported: no torch_npu probe.
    experimental_config(o["level"], o["export"], mstx_supported=True)
    o["level"] = o["level"].lower()
    o["out"] = _check_out(o["out"])
    verl = bool(recipe.stages)
    steps = o["steps"]
    if steps is not None and not verl:
        raise ValueError(
            f"steps applies to the verl recipes only: {recipe.name} runs where verl's step is"
            " not known; place its window with wait/warmup/active"
        )
    o["steps"] = tuple(check_ints([steps] if isinstance(steps, int) else steps, "steps", 1)
                       if steps is not None else ())  # fmt: skip
    if steps is not None and not o["steps"]:
        raise ValueError("steps must list at least one step")
    role = o["role"]
    if role is not None:
        if not isinstance(role, str):
            raise TypeError(f"role must be a str, got {type(role).__name__} {role!r}")
        if role not in recipe.roles:
            allowed = ", ".join(recipe.roles) or "none (not a verl recipe)"
            raise ValueError(f"role {role!r} for {recipe.name} must be one of {allowed}")
    return o


def capture(
    recipe: str,
    *,
    wait: int = 0,
    warmup: int = 0,
    active: int = 1,
    repeat: int = 1,
    skip_first: int = 0,
    steps: Union[int, Sequence[int], None] = None,
    role: Optional[str] = None,
    level: str = "level1",
    export: Union[str, Sequence[str]] = "db",
    record_shapes: bool = False,
    with_modules: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
    analyse: bool = True,
    out: Union[str, os.PathLike[str], None] = None,
) -> Capture:
    """Arm ``recipe`` in this process; returns its :class:`Capture` (``.undo()`` disarms).

    The schedule is torch's, per window: ``skip_first`` steps, then ``wait`` skipped steps,
    ``warmup`` steps and ``active`` recorded steps, ``repeat`` times. ``steps`` (verl recipes):
    the global steps to capture (default every one); ``role``: actor, critic or ref (the roles
    the recipe covers; default all of them). ``level`` is level_none, level0, level1 or level2;
    ``export`` "db", "text" or both; ``record_shapes``, ``with_modules``, ``profile_memory``,
    ``with_stack`` are the profiler's; ``analyse=False`` writes unparsed data and prints the
    offline-analysis line. ``out`` is the folder above the recipe's folder (default
    ``MSTX_MARKS_OUT``, else ``./outputs``, made absolute now). A recipe may be armed once at
    a time in a process.

    >>> with capture("update_micro_batch", wait=1, warmup=1, active=2, out="prof") as handle:
    ...     handle.total, os.path.basename(handle.out)
    (4, 'prof')
    >>> capture("update_micro_batch", active=0)
    Traceback (most recent call last):
    ...
    ValueError: active must be >= 1, got 0
    """
    if not isinstance(recipe, str):
        raise TypeError(f"recipe must be a str, got {type(recipe).__name__} {recipe!r}")
    row = BY_NAME.get(recipe)
    if row is None:
        raise ValueError(f"unknown recipe {recipe!r}; expected one of {', '.join(BY_NAME)}")
    options = _check_options(row, dict(
        wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first,
        steps=steps, role=role, level=level, export=export, record_shapes=record_shapes,
        with_modules=with_modules, profile_memory=profile_memory, with_stack=with_stack,
        analyse=analyse, out=out,
    ))  # fmt: skip
    handle = Capture(row, options)
    with _lock:
        if any(c.recipe.name == recipe for c in _armed):
            raise ValueError(f"recipe {recipe!r} is already armed in this process; undo() it first")
        _armed.append(handle)
    if row.stages:
        arm_stages(row.stages)
    for target in row.targets:
        when_imported(target.module, functools.partial(handle._attach, target))
    for module, what in row.unreachable:
        when_imported(module, functools.partial(cannot_attach, row, what))
    return handle


@atexit.register
def _stop_unfinished() -> None:
    """A loop that ended before its window did: stop the profiler so the trace of the steps
    that ran is written, and say so once, rather than lose the capture silently."""
    for handle in list(_armed):
        for window in handle.stepper.open_windows():
            warn_once(
                ("recipe unfinished", handle.recipe.name),
                f"recipe {handle.recipe.name}: the process ends after {window.steps} of its"
                f" {window.total} steps; the trace in {window.context.folder} holds those",
            )
        handle.undo()


def armed() -> tuple[Capture, ...]:
    """The captures armed in this process that are not done yet.

    >>> handle = capture("rollout_decode")
    >>> [c.recipe.name for c in armed()]
    ['rollout_decode']
    >>> handle.undo(); armed()
    ()
    """
    with _lock:
        return tuple(_armed)


def arm_from_text(text: str) -> None:
    """Arm the recipes of ``MSTX_MARKS_CAPTURE``'s text: ``RECIPE:key=value,...`` entries
    separated by ``;``; the keys of :func:`capture` (ints; ``steps=[2,4]``; booleans true or
    false; ``module``, ``memory``, ``shapes``, ``stack`` and ``analysis`` also name the flags).
    An entry that is wrong warns once, naming ``MSTX_MARKS_CAPTURE``, the entry and the rule,
    and arms nothing; the others are armed. Never raises.

    >>> arm_from_text("rollout_decode:wait=2,active=3; update_mini_batch:active=1,steps=[2,4]")
    >>> [(c.recipe.name, c.total, c.steps) for c in armed()]
    [('rollout_decode', 5, ()), ('update_mini_batch', 1, (2, 4))]
    >>> for c in armed():
    ...     c.undo()
    """
    bad: list[tuple[str, Exception]] = []
    for raw in str(text).split(";"):
        entry = raw.strip()
        if not entry:
            continue
        try:
            name, options = parse_entry(entry)
            capture(name, **options)
        except Exception as exc:
            bad.append((entry, exc))
    if bad:  # one warning for the variable, every echoed value cut (a huge value is no log)
        first, why = bad[0]
        more = f"; and {len(bad) - 1} more bad entries" if len(bad) > 1 else ""
        warn_once(
            (env.CAPTURE, text[: env.QUOTE]),
            f"ignoring {env.quoted(first)} in {env.CAPTURE}={env.quoted(str(text))}:"
            f" {env.shown(why, 2 * env.QUOTE)}{more}",
        )
