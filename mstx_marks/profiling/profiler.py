"""An MSTX-enabled profiler configuration that never warns, and profiler/schedule builders.

torch_npu's ``_ExperimentalConfig`` prints a warning and silently resets a value for most
mistakes. :func:`experimental_config` checks the same rules up front and raises instead, and
returns the keyword arguments (a plain ``dict``) that the real class then accepts unchanged:

>>> kw = experimental_config(level="level1", export="db", exclude=["communication"])
>>> kw["profiler_level"], kw["aic_metrics"], kw["mstx"], kw["mstx_domain_exclude"]
('Level1', 'ACL_AICORE_PIPE_UTILIZATION', True, ['communication'])

:func:`build_profiler` builds ``torch_npu.profiler.profile`` on an NPU host and the equivalent
``torch.profiler.profile`` elsewhere; :func:`capture_steps` profiles chosen calls of a loop body.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, Callable, Dict, Optional, Union

from mstx_marks.base.checks import check_bool as _check_bool
from mstx_marks.base.checks import check_int as _check_count
from mstx_marks.base.checks import check_names as _names
from mstx_marks.base.names import check_domain
from mstx_marks.profiling.options import AIC_METRICS, CONTENTS, EXPORT_TYPES, HOST_SYS, LEVELS
from mstx_marks.profiling.windows import Schedule, Stepper

__all__ = [
    "AIC_METRICS",
    "CONTENTS",
    "HOST_SYS",
    "LEVELS",
    "CaptureHandle",
    "ExperimentalConfigArgs",
    "build_profiler",
    "capture_steps",
    "experimental_config",
    "profiler_schedule",
]


def _torch_npu() -> Any:
    """torch_npu, imported only when a caller needs it (an optional dependency)."""
    return importlib.import_module("torch_npu")


class ExperimentalConfigArgs(Dict[str, Any]):
    """Keyword arguments for ``torch_npu.profiler._ExperimentalConfig``: a plain ``dict``."""

    def build(self) -> Any:
        """Return the real ``_ExperimentalConfig`` (needs an importable torch_npu)."""
        return _torch_npu().profiler._ExperimentalConfig(**self)


def _level(level: object) -> str:
    if not isinstance(level, str):
        raise TypeError(f"level must be a str, got {type(level).__name__} {level!r}")
    if level.lower() not in LEVELS:
        raise ValueError(f"level {level!r} must be one of {', '.join(LEVELS)}")
    return LEVELS[level.lower()]


def _aic(aic_metrics: object, level: str) -> str:
    if aic_metrics is None:
        return AIC_METRICS["AiCoreNone" if level in ("Level0", "Level_none") else "PipeUtilization"]
    value = AIC_METRICS.get(aic_metrics, aic_metrics) if isinstance(aic_metrics, str) else None
    if value not in AIC_METRICS.values():
        raise ValueError(f"aic_metrics {aic_metrics!r} must be one of {', '.join(AIC_METRICS)}")
    if level in ("Level0", "Level_none") and value != AIC_METRICS["AiCoreNone"]:
        raise ValueError(
            f"aic_metrics {aic_metrics!r} needs level1 or level2; {level} collects no aic metrics"
        )
    return str(value)


def _mstx_supported() -> bool:
    """Whether the installed torch_npu's ``_ExperimentalConfig`` has ``mstx`` (True if none)."""
    try:
        config_class = _torch_npu().profiler._ExperimentalConfig
    except Exception:  # torch_npu absent or broken (no CANN): assume a current release
        return True
    return "mstx" in inspect.signature(config_class).parameters


def experimental_config(
    level: str = "level0",
    export: Union[str, Sequence[str]] = "db",
    *,
    include: Optional[Iterable[str]] = None,
    exclude: Optional[Iterable[str]] = None,
    aic_metrics: Optional[str] = None,
    l2_cache: bool = False,
    op_attr: bool = False,
    record_op_args: bool = False,
    data_simplification: bool = True,
    gc_detect_threshold: Optional[float] = None,
    host_sys: Optional[Iterable[str]] = None,
    sys_io: bool = False,
    sys_interconnection: bool = False,
    mstx_supported: Optional[bool] = None,
) -> ExperimentalConfigArgs:
    """Keyword arguments for ``torch_npu.profiler._ExperimentalConfig`` with MSTX on.

    ``level``: level_none, level0, level1 or level2. ``export``: "db", "text" or both.
    ``include``/``exclude``: MSTX domain names (one or the other). ``aic_metrics``: an
    ``AiCMetrics`` name (``"PipeUtilization"``) or value, at level1/level2 only; the default is
    AiCoreNone at level0/level_none and PipeUtilization above. ``mstx_supported=None`` asks the
    installed torch_npu whether it has ``mstx`` (else the deprecated ``msprof_tx`` is used).
    Keys that newer releases added (``host_sys``, ``sys_io``...) are present only when set.

    >>> sorted(experimental_config("level_none", export=["db", "text"], include=["verl"]).items())
    ... # doctest: +NORMALIZE_WHITESPACE
    [('aic_metrics', 'ACL_AICORE_NONE'), ('data_simplification', True),
     ('export_type', ['db', 'text']), ('mstx', True), ('mstx_domain_include', ['verl']),
     ('profiler_level', 'Level_none')]
    >>> experimental_config("level0", aic_metrics="PipeUtilization")
    Traceback (most recent call last):
    ...
    ValueError: aic_metrics 'PipeUtilization' needs level1 or level2; Level0 collects no aic metrics
    """
    # Long by design: one check per torch_npu option, in the order the class validates them.
    profiler_level = _level(level)
    exports = [export] if isinstance(export, str) else _names(export, "export")
    if not exports or any(e not in EXPORT_TYPES for e in exports):
        raise ValueError(f"export {export!r} must be 'db', 'text' or both")
    kwargs = ExperimentalConfigArgs(
        profiler_level=profiler_level,
        aic_metrics=_aic(aic_metrics, profiler_level),
        export_type=exports[0] if len(exports) == 1 else exports,
        data_simplification=_check_bool(data_simplification, "data_simplification"),
    )
    if mstx_supported is None:
        mstx_supported = _mstx_supported()
    kwargs["mstx" if _check_bool(mstx_supported, "mstx_supported") else "msprof_tx"] = True

    inc = [check_domain(d) for d in _names(include, "include")] if include is not None else []
    exc = [check_domain(d) for d in _names(exclude, "exclude")] if exclude is not None else []
    if inc and exc:
        raise ValueError(
            f"include {inc!r} and exclude {exc!r} cannot both be set: torch_npu keeps only include"
        )
    if inc:
        kwargs["mstx_domain_include"] = inc
    if exc:
        kwargs["mstx_domain_exclude"] = exc

    for flag, value in (
        ("l2_cache", l2_cache),
        ("op_attr", op_attr),
        ("record_op_args", record_op_args),
        ("sys_io", sys_io),
        ("sys_interconnection", sys_interconnection),
    ):
        if _check_bool(value, flag):
            kwargs[flag] = True
    if op_attr and "db" not in exports:
        raise ValueError("op_attr=True needs export 'db'; torch_npu drops op_attr with text export")
    if gc_detect_threshold is not None:
        if isinstance(gc_detect_threshold, bool) or not isinstance(
            gc_detect_threshold, (int, float)
        ):
            raise TypeError(f"gc_detect_threshold must be a number, got {gc_detect_threshold!r}")
        if not gc_detect_threshold >= 0:
            raise ValueError(f"gc_detect_threshold must be >= 0, got {gc_detect_threshold!r}")
        kwargs["gc_detect_threshold"] = gc_detect_threshold
    if host_sys is not None:
        hosts = _names(host_sys, "host_sys", HOST_SYS)
        if hosts:
            kwargs["host_sys"] = hosts
    return kwargs


def _npu_available() -> bool:
    try:
        return bool(_torch_npu().npu.is_available())
    except Exception:  # absent, or present without CANN
        return False


def profiler_schedule(
    *,
    wait: int = 0,
    warmup: int = 0,
    active: int = 1,
    repeat: int = 1,
    skip_first: int = 0,
    npu: Optional[bool] = None,
) -> Callable[[int], Any]:
    """A profiler schedule, built with keywords (torch_npu's positional order differs from torch's).

    ``npu=None`` picks ``torch_npu.profiler.schedule`` when an NPU is present, else
    ``torch.profiler.schedule``. ``repeat=0`` means "until the profiler stops".

    >>> s = profiler_schedule(wait=1, warmup=1, active=2, npu=False)
    >>> [s(i).name for i in range(5)]
    ['NONE', 'WARMUP', 'RECORD', 'RECORD_AND_SAVE', 'NONE']
    """
    args = {
        "wait": _check_count(wait, "wait"),
        "warmup": _check_count(warmup, "warmup"),
        "active": _check_count(active, "active", 1),
        "repeat": _check_count(repeat, "repeat"),
        "skip_first": _check_count(skip_first, "skip_first"),
    }
    if npu is None:
        npu = _npu_available()
    if npu:
        return _torch_npu().profiler.schedule(**args)  # type: ignore[no-any-return]
    import torch

    with warnings.catch_warnings():
        # torch warns about warmup=0 (torch_npu prints the same advice, which cannot be silenced
        # here); the choice is the caller's.
        warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
        return torch.profiler.schedule(**args)


def build_profiler(
    *,
    contents: Iterable[str] = (),
    level: str = "level0",
    analysis: bool = True,
    save_path: Optional[str] = None,
    export: Union[str, Sequence[str]] = "db",
    include: Optional[Iterable[str]] = None,
    exclude: Optional[Iterable[str]] = None,
    wait: int = 0,
    warmup: int = 0,
    active: Optional[int] = None,
    repeat: int = 1,
    skip_first: int = 0,
    on_trace_ready: Optional[Callable[..., Any]] = None,
    npu: Optional[bool] = None,
) -> Any:
    """A profiler from verl-style options, MSTX on: torch_npu's on an NPU, torch's elsewhere.

    ``contents`` is a subset of npu, cpu, memory, shapes, module, stack (verl's meaning: device
    activity when empty or "npu" is listed, CPU always). MSTX ranges are collected only with
    device activity, so ``contents=["cpu"]`` on an NPU profiles without them. ``active=None``
    records everything between ``start()`` and ``stop()``; otherwise the schedule is
    wait/warmup/active/repeat/skip_first. Traces go to ``save_path`` (tensorboard trace handler;
    ``analysis`` parses them on an NPU) unless ``on_trace_ready`` is given. Every option is
    checked on every host.

    >>> prof = build_profiler(contents=["cpu"], active=1, npu=False)
    >>> with prof:
    ...     prof.step()
    """
    # Long by design: the docstring and the two hosts' builds (torch_npu, torch) side by side.
    wanted = _names(contents, "contents", CONTENTS)
    exp = experimental_config(level, export, include=include, exclude=exclude)
    _check_bool(analysis, "analysis")
    if save_path is not None and (not isinstance(save_path, str) or not save_path):
        raise ValueError(f"save_path must be a non-empty str, got {save_path!r}")
    sched = None
    if active is not None:
        sched = profiler_schedule(
            wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first, npu=npu
        )
    if npu is None:
        npu = _npu_available()
    device = not wanted or "npu" in wanted
    common: Dict[str, Any] = {
        "schedule": sched,
        "record_shapes": "shapes" in wanted,
        "profile_memory": "memory" in wanted,
        "with_stack": "stack" in wanted,
        "with_modules": "module" in wanted,
    }
    if npu:
        prof = _torch_npu().profiler
        if on_trace_ready is None and save_path is not None:
            on_trace_ready = prof.tensorboard_trace_handler(save_path, analyse_flag=analysis)
        activities = [prof.ProfilerActivity.CPU]
        if device:
            activities.append(prof.ProfilerActivity.NPU)
        return prof.profile(
            activities=activities,
            on_trace_ready=on_trace_ready,
            experimental_config=exp.build(),
            **common,
        )
    import torch

    tprof = torch.profiler
    if on_trace_ready is None and save_path is not None:
        on_trace_ready = tprof.tensorboard_trace_handler(save_path)
    tacts = [tprof.ProfilerActivity.CPU]
    if device and torch.cuda.is_available():
        tacts.append(tprof.ProfilerActivity.CUDA)
    return tprof.profile(activities=tacts, on_trace_ready=on_trace_ready, **common)


class CaptureHandle:
    """What :func:`capture_steps` returns: ``stop()`` (or leaving a ``with``) ends the capture.

    A view of the capture engine's :class:`~mstx_marks.profiling.windows.Stepper`: ``calls`` is
    the calls profiled so far, ``done`` whether the capture ended.
    """

    def __init__(self, profiler: Any, stepper: Stepper) -> None:
        self.profiler = profiler
        self.total = stepper.total
        self._stepper = stepper

    @property
    def calls(self) -> int:
        windows = self._stepper.windows
        return windows[0].steps if windows else 0

    @property
    def done(self) -> bool:
        return self._stepper.done

    def stop(self) -> None:
        """Stop the profiler (flushing what it holds) and restore the target. Idempotent."""
        self._stepper.finish()

    def __enter__(self) -> CaptureHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def capture_steps(
    target: Any,
    name: str,
    *,
    wait: int = 0,
    warmup: int = 0,
    active: int = 1,
    repeat: int = 1,
    skip_first: int = 0,
    save_path: Optional[str] = None,
    label: Optional[str] = None,
    **profiler_options: Any,
) -> CaptureHandle:
    """Profile only chosen calls of ``target.name`` (a method, a function of a module).

    Call ``k`` (from 0) is profiler step ``k`` of the schedule skip_first, then (wait, warmup,
    active) x ``repeat``; each call is a ``record_function`` range ``"{label}#{k}"`` (label
    defaults to ``name``). The profiler starts at the first call, steps after each call, and
    stops and restores the target when the window ends, on ``stop()``, or when a call raises.
    ``profiler_options`` go to :func:`build_profiler`. The recipes run on the same engine
    (:mod:`mstx_marks.profiling.windows`).

    >>> class Loop:
    ...     def step(self):
    ...         return 1
    >>> handle = capture_steps(Loop, "step", wait=1, active=1, npu=False, on_trace_ready=print)
    >>> loop = Loop(); _ = [loop.step() for _ in range(3)]  # doctest: +ELLIPSIS
    <torch.profiler.profiler.profile object at ...>
    >>> handle.done, "step" in vars(Loop)
    (True, True)
    """
    repeat = _check_count(repeat, "repeat", 1)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name {name!r} must be an attribute name")
    label = name if label is None else label
    if not isinstance(label, str) or not label:
        raise ValueError(f"label {label!r} must be a non-empty str")
    prof = build_profiler(
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        skip_first=skip_first,
        save_path=save_path,
        **profiler_options,
    )
    schedule = Schedule(wait, warmup, active, repeat, skip_first)
    stepper = Stepper(schedule, lambda context: prof, name=f"capture_steps({name})", strict=True,
                      label=label)  # fmt: skip
    stepper.add_iteration(target, name)
    return CaptureHandle(prof, stepper)
