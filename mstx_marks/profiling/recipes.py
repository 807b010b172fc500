"""Profiler recipes: a scheduled profiler around one framework loop, without editing its source.

The Ascend RL profiling guide has users hand-edit verl, vLLM, vllm-ascend or SGLang to build a
``torch_npu.profiler.profile`` with a ``schedule``, ``start()`` it and ``step()`` it once per
iteration of one loop (decode steps, log-prob micro-batches, update mini- or micro-batches).
Each such edit is a named recipe here. Arming a recipe waits for the framework module to be
imported (it never imports it), patches the call that is one iteration, and, in the process that
runs the loop, builds the profiler at the first counted call (MSTX on, the guide's options:
CPU and device activity, level1 and db export by default), calls its ``step()`` after each
counted call and, once the schedule's ``(wait + warmup + active) * repeat`` steps are done,
stops it and restores the patched method, so later calls cost nothing. Traces go to
``<out>/<role>_<recipe>``: ``<out>`` is ``out=``, else ``MSTX_MARKS_OUT``, else
``./mstx_marks_capture``; ``<role>`` is ``ref`` or ``actor`` for the log-prob recipes and the
process's role (:func:`mstx_marks.export.out.process_role`) for the others.

From the environment, in every process of a job (several recipes separated by ``;``)::

    MSTX_MARKS_CAPTURE="rollout_decode:wait=29,warmup=1,active=30,repeat=1,level=level1"

The same from Python:

>>> handle = capture("rollout_decode", wait=29, warmup=1, active=30)
>>> handle.total, handle.done
(60, False)
>>> handle.undo()
>>> handle.done
True

Annotation never breaks the workload: the wrapped call always runs and its exceptions pass
through untouched (the step still counts); a profiler that fails to build, start or step warns
once and the recipe disarms itself. Only one recipe's profiler runs at a time in a process (torch
allows one): a recipe whose loop starts while another's profiler runs counts no call until that
one is done. ``python -m mstx_marks recipes`` prints :func:`recipes_table`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import threading
from collections.abc import Sequence
from types import ModuleType, TracebackType
from typing import Any, Callable, NamedTuple, Optional, Union

from mstx_marks.base import env
from mstx_marks.base.checks import check_int
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.import_hooks import when_imported
from mstx_marks.capture.instrument import Instrumented, replace
from mstx_marks.core.engine import rewrap
from mstx_marks.profiling.profiler import experimental_config

__all__ = [
    "RECIPES",
    "Capture",
    "Recipe",
    "arm_from_text",
    "armed",
    "capture",
    "recipes_table",
]

#: Where traces go when neither ``out=`` nor ``MSTX_MARKS_OUT`` says.
DEFAULT_OUT = "mstx_marks_capture"

_VERL_WARNING = (
    "verl's global profiler is on; the guide says to turn it off (global_profiler.steps=null)"
    " while a recipe captures"
)


class Recipe(NamedTuple):
    """One profiler recipe: the call that is one step of the schedule, and what it replaces."""

    #: The recipe's name (``MSTX_MARKS_CAPTURE="NAME:..."``, ``capture(NAME)``).
    name: str
    #: ``(module, "Class.method")`` pairs: the call that is one step, in each framework version.
    targets: tuple[tuple[str, str], ...]
    #: Which calls count as a step.
    step: str
    #: The hand edit of the guide it replaces (one line).
    replaces: str
    #: Frameworks and versions the targets were checked in.
    frameworks: str
    #: The ``<role>`` of the trace folder; ``""``: the process's role.
    role: str = ""


_FSDP = "verl.workers.engine.fsdp.transformer_impl"
_FORWARD_STEP = (_FSDP, "FSDPEngineWithLMHead.forward_step")

RECIPES: tuple[Recipe, ...] = (
    Recipe(
        "rollout_decode",
        (
            ("vllm.v1.worker.gpu_worker", "Worker.execute_model"),
            ("vllm_ascend.worker.worker_v1", "NPUWorker.execute_model"),
            ("vllm_ascend.worker.worker", "NPUWorker.execute_model"),
            ("sglang.srt.model_executor.model_runner", "ModelRunner.forward"),
        ),
        "every call (each engine step's model run, prefill and decode batches alike)",
        "vllm-ascend worker.py: a torch_npu profiler built in NPUWorker.__init__, step() after"
        " each execute_model (SGLang: around ModelRunner.forward)",
        "vLLM 0.11-0.33 (CPUWorker inherits Worker.execute_model); vllm-ascend 0.11 (worker_v1)"
        " and 0.13+ (worker); SGLang 0.5",
    ),
    Recipe(
        "ref_log_prob_micro_batch",
        (_FORWARD_STEP,),
        "each forward-only micro-batch of the reference model (forward_only=True on an engine"
        " whose engine_config.forward_only is True, i.e. without an optimizer)",
        "verl transformer_impl.py: a torch_npu profiler around FSDPEngine.forward_backward_batch's"
        " micro-batch loop, step() after each micro-batch, role Ref",
        "verl 0.9.1 FSDP engine (the Megatron engine has no Python micro-batch loop)",
        role="ref",
    ),
    Recipe(
        "actor_log_prob_micro_batch",
        (_FORWARD_STEP,),
        "each forward-only micro-batch of the actor's compute_log_prob (forward_only=True on an"
        " engine with an optimizer)",
        "verl transformer_impl.py: a torch_npu profiler around FSDPEngine.forward_backward_batch's"
        " micro-batch loop, step() after each micro-batch, role Actor",
        "verl 0.9.1 FSDP engine (the Megatron engine has no Python micro-batch loop)",
        role="actor",
    ),
    Recipe(
        "update_mini_batch",
        (("verl.workers.engine_workers", "TrainingWorker.train_batch"),),
        "each mini-batch of TrainingWorker.train_mini_batch (one train_batch call each)",
        "verl engine_workers.py: a torch_npu profiler around TrainingWorker.train_mini_batch's"
        " mini-batch loop, step() after each train_batch",
        "verl 0.9.1, FSDP and Megatron engines (actor and critic updates)",
    ),
    Recipe(
        "update_micro_batch",
        (_FORWARD_STEP,),
        "each training micro-batch of the FSDP engine (forward_step with forward_only=False;"
        " its backward runs after the call, outside the step)",
        "verl transformer_impl.py: a torch_npu profiler around FSDPEngine.forward_backward_batch's"
        " micro-batch loop in training mode, step() after each micro-batch",
        "verl 0.9.1 FSDP engine only; Megatron supports mini-batch only (update_mini_batch)",
    ),
)

_BY_NAME: dict[str, Recipe] = {r.name: r for r in RECIPES}
_VERL_RECIPES = frozenset(r.name for r in RECIPES if r.frameworks.startswith("verl"))


# --- which calls count ---------------------------------------------------------------------

_ABSENT = object()


def _forward_only(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """The ``forward_only`` of ``forward_step(self, micro_batch, loss_function, forward_only)``."""
    if "forward_only" in kwargs:
        return kwargs["forward_only"]
    return args[3] if len(args) > 3 else None


def _is_ref(engine: object) -> bool:
    """verl's reference engine: ``engine_config.forward_only`` is True (then ``optimizer`` is
    None); an engine without that flag is the reference when its ``optimizer`` is None."""
    flag = getattr(getattr(engine, "engine_config", None), "forward_only", None)
    if isinstance(flag, bool):
        return flag
    return getattr(engine, "optimizer", _ABSENT) is None


def _every(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return True


def _ref_log_prob(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return _forward_only(args, kwargs) is True and _is_ref(args[0])


def _actor_log_prob(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return _forward_only(args, kwargs) is True and not _is_ref(args[0])


def _training(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return _forward_only(args, kwargs) is False


_COUNTS: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], bool]] = {
    "rollout_decode": _every,
    "ref_log_prob_micro_batch": _ref_log_prob,
    "actor_log_prob_micro_batch": _actor_log_prob,
    "update_mini_batch": _every,
    "update_micro_batch": _training,
}


def _verl_profiler_on(worker: object) -> bool:
    """Whether ``worker`` carries verl's DistProfiler (``self.profiler``) and it is enabled."""
    try:
        profiler = getattr(worker, "profiler", None)
        return profiler is not None and profiler.check_enable() is True
    except Exception:  # a probe must never break the workload
        return False


# --- captures and the patched sites ---------------------------------------------------------

_lock = threading.RLock()
#: The captures armed in this process and not done.
_armed: list[Capture] = []
#: The one capture whose profiler exists now (torch runs one profiler at a time).
_running: Optional[Capture] = None


class _Site:
    """One patched method, shared by every capture that counts its calls."""

    def __init__(self, key: tuple[str, str]) -> None:
        self.key = key
        self.captures: tuple[Capture, ...] = ()
        self.handle: Optional[Instrumented] = None


_sites: dict[tuple[str, str], _Site] = {}


def _wrap(site: _Site, inner: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(inner)  # keeps verl's `register` attribute (in __dict__) and __wrapped__
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        captures = site.captures
        if not captures:
            return inner(*args, **kwargs)
        entered = [c for c in captures if c._enter(args, kwargs)]
        try:
            return inner(*args, **kwargs)
        finally:
            for c in entered:
                c._exit()

    return wrapper


def _attach(capture: Capture, module_name: str, path: str, module: ModuleType) -> None:
    """Runs when ``module_name`` is imported: add ``capture`` to that method's site."""
    key = (module_name, path)
    if capture.done:
        return
    owner_name, _, attr = path.rpartition(".")
    owner = getattr(module, owner_name, None)
    if not isinstance(owner, type) or not callable(getattr(owner, attr, None)):
        warn_once(
            ("recipe target", capture.recipe.name, key),
            f"recipe {capture.recipe.name}: {module_name} has no {path} (it is in"
            f" {capture.recipe.frameworks}); nothing is captured there",
        )
        return
    with _lock:
        if capture.done:
            return
        site = _sites.get(key)
        if site is None:
            site = _Site(key)
            # again=True: a method a preset already wraps in ranges is captured with its ranges.
            site.handle = replace(
                owner,
                attr,
                lambda o, a, raw: rewrap(raw, functools.partial(_wrap, site)),
                again=True,
            )
            _sites[key] = site
        if capture not in site.captures:
            site.captures += (capture,)
        capture._sites.append(site)


def _detach(capture: Capture) -> None:
    with _lock:
        for site in capture._sites:
            site.captures = tuple(c for c in site.captures if c is not capture)
            if not site.captures:
                if site.handle is not None:
                    site.handle.undo()
                _sites.pop(site.key, None)
        capture._sites.clear()


def _safe(word: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", word) or "python"


class Capture:
    """An armed recipe in this process: what :func:`capture` returns.

    ``steps`` counts the calls counted so far, ``total`` is the schedule's length, ``done`` is
    True once the schedule ended, the recipe was undone or it disarmed itself. ``save_path`` is
    the trace folder (known once the first counted call built the profiler). Also a context
    manager that undoes on exit.
    """

    def __init__(
        self,
        recipe: Recipe,
        *,
        wait: int,
        warmup: int,
        active: int,
        repeat: int,
        level: str,
        export: Union[str, Sequence[str]],
        out: str,
    ) -> None:
        self.recipe = recipe
        self.wait, self.warmup, self.active, self.repeat = wait, warmup, active, repeat
        self.level, self.export, self.out = level, export, out
        self.total = (wait + warmup + active) * repeat
        self.steps = 0
        self.done = False
        self.role: Optional[str] = None
        self.save_path: Optional[str] = None
        self.profiler: Any = None
        self._counts = _COUNTS[recipe.name]
        self._verl = recipe.name in _VERL_RECIPES
        self._sites: list[_Site] = []
        self._lock = threading.RLock()
        self._local = threading.local()

    # Runs before each call of a patched method: whether this call is one of our steps.
    def _enter(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        try:
            if self.done or getattr(self._local, "inside", False) or not args:
                return False  # a patched subclass method calling its patched base: one step
            if not self._counts(args, kwargs):
                return False
            with self._lock:
                if self.done:
                    return False
                if self.profiler is None and not self._begin(args[0]):
                    return False
            self._local.inside = True
            return True
        except Exception as exc:  # never into the workload
            self._fail("could not count a call", exc)
            return False

    def _begin(self, worker: object) -> bool:
        """The first counted call: build and start the profiler (False: not now, or failed)."""
        global _running
        with _lock:
            if _running is not None and _running is not self:
                return False  # another recipe's profiler runs: this one waits for it
            _running = self
        if self._verl and _verl_profiler_on(worker):
            warn_once(("recipe verl profiler", self.recipe.name), _VERL_WARNING)
        try:
            from mstx_marks.export.out import process_role
            from mstx_marks.profiling.profiler import build_profiler

            self.role = self.recipe.role or process_role()
            self.save_path = os.path.join(self.out, f"{_safe(self.role)}_{self.recipe.name}")
            profiler = build_profiler(
                contents=("npu", "cpu"),
                level=self.level,
                export=self.export,
                save_path=self.save_path,
                wait=self.wait,
                warmup=self.warmup,
                active=self.active,
                repeat=self.repeat,
            )
            profiler.start()
        except Exception as exc:
            self._fail("the profiler could not be built or started", exc)
            return False
        self.profiler = profiler
        return True

    # Runs after each counted call, whether it returned or raised.
    def _exit(self) -> None:
        self._local.inside = False
        try:
            with self._lock:
                if self.done:
                    return
                self.steps += 1
                self.profiler.step()
                if self.steps >= self.total:
                    self._finish()
        except Exception as exc:
            self._fail("the profiler failed to step", exc)

    def _fail(self, what: str, exc: BaseException) -> None:
        warn_once(
            ("recipe failed", self.recipe.name),
            f"recipe {self.recipe.name}: {what} ({type(exc).__name__}: {exc});"
            " the recipe is disarmed and the job runs on",
        )
        with contextlib.suppress(Exception):
            self._finish()

    def _finish(self) -> None:
        """Stop the profiler (flushing what it holds), restore the patched methods. Idempotent."""
        global _running
        with self._lock:
            if self.done:
                return
            self.done = True
            profiler, self.profiler = self.profiler, None
        try:
            if profiler is not None:
                profiler.stop()
        except Exception as exc:
            warn_once(
                ("recipe stop", self.recipe.name),
                f"recipe {self.recipe.name}: the profiler failed to stop"
                f" ({type(exc).__name__}: {exc})",
            )
        finally:
            with _lock:
                if _running is self:
                    _running = None
                if self in _armed:
                    _armed.remove(self)
            _detach(self)

    def undo(self) -> None:
        """Disarm: stop the profiler if it runs (what it recorded is written), restore the
        patched methods. Any number of calls.

        >>> handle = capture("update_mini_batch", active=2)
        >>> handle.undo(); handle.undo()
        >>> handle.done, handle.steps
        (True, 0)
        """
        self._finish()

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
            f" active={self.active}, repeat={self.repeat}, steps={self.steps}, done={self.done})"
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


def capture(
    recipe: str,
    *,
    wait: int = 0,
    warmup: int = 0,
    active: int = 1,
    repeat: int = 1,
    level: str = "level1",
    export: Union[str, Sequence[str]] = "db",
    out: Union[str, os.PathLike[str], None] = None,
) -> Capture:
    """Arm ``recipe`` in this process; returns its :class:`Capture` (``.undo()`` disarms).

    The schedule is torch's: ``wait`` skipped steps, ``warmup`` steps, ``active`` recorded
    steps, all ``repeat`` times (at least once: the recipe must end to restore the method).
    ``level`` is level_none, level0, level1 or level2; ``export`` "db", "text" or both;
    ``out`` the folder above ``<role>_<recipe>`` (default ``MSTX_MARKS_OUT``, else
    ``./mstx_marks_capture``, made absolute now). Every argument is checked here: a wrong type
    is a TypeError, a bad value a ValueError, both naming the value and the rule. A recipe may
    be armed once at a time in a process.

    >>> with capture("update_micro_batch", wait=1, warmup=1, active=2, out="prof") as handle:
    ...     handle.total, os.path.basename(handle.out)
    (4, 'prof')
    >>> capture("update_micro_batch", active=0)
    Traceback (most recent call last):
    ...
    ValueError: active must be >= 1, got 0
    >>> capture("decode")
    Traceback (most recent call last):
    ...
    ValueError: unknown recipe 'decode'; expected one of rollout_decode, ref_log_prob_micro_batch, \
actor_log_prob_micro_batch, update_mini_batch, update_micro_batch
    """
    if not isinstance(recipe, str):
        raise TypeError(f"recipe must be a str, got {type(recipe).__name__} {recipe!r}")
    row = _BY_NAME.get(recipe)
    if row is None:
        raise ValueError(f"unknown recipe {recipe!r}; expected one of {', '.join(_BY_NAME)}")
    wait = check_int(wait, "wait")
    warmup = check_int(warmup, "warmup")
    active = check_int(active, "active", 1)
    repeat = check_int(repeat, "repeat", 1)
    if not isinstance(export, str):
        export = list(export) if isinstance(export, Sequence) else export
    # The checks build_profiler makes later (level, export), made now; mstx_supported: no
    # torch_npu probe.
    experimental_config(level, export, mstx_supported=True)
    folder = _check_out(out)
    handle = Capture(
        row,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        level=level.lower(),  # a str: experimental_config checked it
        export=export,
        out=folder,
    )
    with _lock:
        if any(c.recipe.name == recipe for c in _armed):
            raise ValueError(f"recipe {recipe!r} is already armed in this process; undo() it first")
        _armed.append(handle)
    for module_name, path in row.targets:
        when_imported(module_name, functools.partial(_attach, handle, module_name, path))
    return handle


@atexit.register
def _stop_unfinished() -> None:
    """A loop that ended before its schedule did: stop the profiler so the trace of the steps
    that ran is written, and say so once, rather than lose the capture silently."""
    for capture in list(_armed):
        if capture.profiler is None:
            continue  # never started here: this process does not run the loop
        warn_once(
            ("recipe unfinished", capture.recipe.name),
            f"recipe {capture.recipe.name}: the process ends after {capture.steps} of its"
            f" {capture.total} steps; the trace in {capture.save_path} holds those",
        )
        capture.undo()


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


_INT_KEYS = ("wait", "warmup", "active", "repeat")
_KEYS = (*_INT_KEYS, "level", "export", "out")
_INT = re.compile(r"[+-]?[0-9]+")


def _parse_entry(entry: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = entry.partition(":")
    name = name.strip()
    if not name:
        raise ValueError("expected RECIPE:key=value,..., e.g. rollout_decode:wait=1,active=2")
    options: dict[str, Any] = {}
    for item in rest.split(","):
        if not item.strip():
            continue
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key or not value:
            raise ValueError(f"{item.strip()!r} is not key=value")
        if key not in _KEYS:
            raise ValueError(f"unknown key {key!r}; expected keys among {', '.join(_KEYS)}")
        if key in options:
            raise ValueError(f"{key} is given twice")
        if key in _INT_KEYS:
            if not _INT.fullmatch(value):
                raise ValueError(f"{key}={value!r} must be an int")
            options[key] = int(value)
        else:
            options[key] = value
    return name, options


def arm_from_text(text: str) -> None:
    """Arm the recipes of ``MSTX_MARKS_CAPTURE``'s text: ``RECIPE:key=value,...`` entries
    separated by ``;``; keys wait, warmup, active, repeat (ints), level, export (db or text) and
    out (a folder without ``,`` or ``;``). An entry that is wrong warns once, naming
    ``MSTX_MARKS_CAPTURE``, the entry and the rule, and arms nothing; the others are armed.
    Never raises.

    >>> arm_from_text("rollout_decode:wait=2,active=3; update_mini_batch:active=1")
    >>> [(c.recipe.name, c.total) for c in armed()]
    [('rollout_decode', 5), ('update_mini_batch', 1)]
    >>> for c in armed():
    ...     c.undo()
    """
    for raw in str(text).split(";"):
        entry = raw.strip()
        if not entry:
            continue
        try:
            name, options = _parse_entry(entry)
            capture(name, **options)
        except Exception as exc:
            warn_once(
                (env.CAPTURE, entry),
                f"ignoring {entry!r} in {env.CAPTURE}={text!r}: {exc}",
            )


def recipes_table() -> str:
    """The listing of ``mstx-marks recipes``: each recipe, where it runs, what a step is, and
    the hand edit of the guide it replaces.

    >>> print(recipes_table().splitlines()[0])
    MSTX_MARKS_CAPTURE="RECIPE:wait=N,warmup=N,active=N,repeat=N[,level=..][,export=..][,out=DIR]"
    >>> "update_micro_batch" in recipes_table()
    True
    """
    lines = [
        f'{env.CAPTURE}="RECIPE:wait=N,warmup=N,active=N,repeat=N[,level=..][,export=..]'
        '[,out=DIR]"',
        "(several separated by ';'); traces in <out>/<role>_<recipe>, <out> = out=, else"
        f" {env.OUT}, else ./{DEFAULT_OUT}",
    ]
    for r in RECIPES:
        lines += [
            "",
            r.name,
            "  runs in:   " + "\n             ".join(f"{m}:{p}" for m, p in r.targets),
            f"  a step:    {r.step}",
            f"  replaces:  {r.replaces}",
            f"  for:       {r.frameworks}",
            f"  trace:     <out>/{r.role or '<process role>'}_{r.name}",
        ]
    return "\n".join(lines)
