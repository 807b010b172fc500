"""``mstx-marks doctor``: would ranges from this machine and environment reach the profiler?

Checks what decides it, in the order it is decided: the off switch and the disable flag, every
``MSTX_MARKS_*`` value, torch_npu and an NPU, the backend that would run, the rank and domain
filters, a profiler config when one is given, and the output folder. Each finding is ``ok``,
``warn`` (ranges get through, but something is worth knowing) or ``stop`` (ranges would not
reach what the settings ask for), and the last line says the verdict in plain words.

Every value is read by the run-time's own code (one home): the routing's
:func:`~mstx_marks.core.configuration.settings_from_env`, the activation's
:func:`~mstx_marks.launch.activate.parse_instrument` and
:func:`~mstx_marks.launch.activate.parse_samples`, the recipes'
:func:`~mstx_marks.profiling.recipes.arm_from_text` (armed, then undone),
:func:`~mstx_marks.base.env.positive_int` and the backends'
:func:`~mstx_marks.backends.create`; whatever the run-time would warn about and ignore is a
``stop`` here. It never raises: a broken install is what it is for.

>>> import os
>>> os.environ["MSTX_MARKS_BACKEND"] = "record"
>>> [f.level for f in diagnose() if f.topic == "backend"]
['ok']
>>> del os.environ["MSTX_MARKS_BACKEND"]
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from mstx_marks import backends
from mstx_marks.base import env
from mstx_marks.base.diagnostics import forget_warnings
from mstx_marks.core import configuration as settings

__all__ = ["Finding", "check_values", "diagnose", "verdict"]

Level = Literal["ok", "warn", "stop"]


@dataclass(frozen=True)
class Finding:
    """One thing the doctor looked at, and what it found."""

    level: Level
    topic: str
    text: str

    def __str__(self) -> str:
        return f"[{self.level:4}] {self.topic}: {self.text}"


@contextmanager
def _heard() -> Iterator[list[str]]:
    """The run-time's warnings, as the run would give them (the once-only ones included)."""
    said: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forget_warnings()
        yield said
    forget_warnings()
    said += [str(w.message).removeprefix("mstx_marks: ") for w in caught]


def _quiet_settings() -> dict[str, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return settings.settings_from_env()


def _ignored(topic: str, said: list[str]) -> list[Finding]:
    return [Finding("stop", topic, f"{text} (the run would ignore it)") for text in said]


def _switches() -> list[Finding]:
    with _heard() as said:
        env.flag(env.OFF)
    out = _ignored("off switch", said)
    if env.off():
        out.append(
            Finding("stop", "off switch", f"{env.OFF}=1: every range is off in this process")
        )
    if env.text(env.DISABLE) is not None and env.flag(env.DISABLE):
        out.append(Finding("stop", "disabled", f"{env.DISABLE} switches every range off"))
    return out


def _routing_values() -> list[Finding]:
    """Backend, disable flag, include, exclude, ranks: :func:`settings_from_env` reads them."""
    with _heard() as said:
        settings.settings_from_env()
    out: list[Finding] = []
    for text in said:
        if text.startswith("ignoring"):
            out.append(Finding("stop", "environment", f"{text} (the run would ignore it)"))
        else:  # both include and exclude: include wins, as in the Ascend profiler
            out.append(Finding("warn", "environment", text))
    return out


def _record_capacity() -> list[Finding]:
    raw = env.text(env.RECORD_CAPACITY)
    if raw is None:
        return []
    import inspect

    from mstx_marks.backends.record import Recorder

    with _heard():
        if env.positive_int(env.RECORD_CAPACITY, -1) != -1:  # the recorder's own reading
            return []
    default = inspect.signature(Recorder).parameters["capacity"].default
    return [
        Finding(
            "stop",
            "environment",
            f"ignoring {env.RECORD_CAPACITY}={env.quoted(raw)}: expected an int >= 1; the"
            f" recorder keeps its default, {default} events",
        )
    ]


def _instrument() -> list[Finding]:
    raw = env.text(env.INSTRUMENT)
    if raw is None:
        return []
    from mstx_marks.launch.activate import parse_instrument

    with _heard() as said:
        names = parse_instrument(raw)
    out = _ignored("instrument", said)
    if names:
        out.append(Finding("ok", "instrument", "presets armed: " + ", ".join(names)))
    else:
        out.append(
            Finding("stop", "instrument", f"{env.INSTRUMENT}={env.quoted(raw)} arms no preset")
        )
    return out + _engines_marked(names)


def _engines_marked(armed: tuple[str, ...]) -> list[Finding]:
    """For each framework installed here (found, not imported), the classes of its hot path a
    preset marks, and whether the setting arms that preset: vllm-ascend's ``NPUWorker`` is the
    ``vllm`` preset's, which a line without ``vllm`` leaves unmarked. A process that runs a
    class no preset knows says so itself, when it builds it."""
    import importlib.util

    from mstx_marks.capture import presets

    out: list[Finding] = []
    # The framework presets (not those named on their own), as their modules declare them.
    for preset in (p.name for p in presets.PRESETS if not p.on_its_own):
        by_package: dict[str, list[str]] = {}
        for t in presets.targets(preset):
            if "." in t.path:
                owner = t.path.rpartition(".")[0]
                by_package.setdefault(t.module.partition(".")[0], []).append(owner)
        for package, owners in by_package.items():
            try:
                found = importlib.util.find_spec(package) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                continue
            classes = ", ".join(dict.fromkeys(owners))
            if preset in armed:
                text = f"{package} is installed: {classes} marked by the {preset!r} preset"
                out.append(Finding("ok", "instrument", text))
            else:
                text = (
                    f"{package} is installed but {env.INSTRUMENT} does not arm {preset!r}, the"
                    f" preset that marks {classes}: its work runs unmarked"
                )
                out.append(Finding("warn", "instrument", text))
    return out


def _sample() -> list[Finding]:
    raw = env.text(env.SAMPLE)
    if raw is None:
        return []
    from mstx_marks.launch.activate import parse_samples

    with _heard() as said:
        found = parse_samples(raw)
    out = _ignored("sample", said)
    if found:
        out.append(Finding("ok", "sample", "sampled phases: " + ", ".join(found)))
    elif not said:
        out.append(Finding("stop", "sample", f"{env.SAMPLE}={env.quoted(raw)} samples no phase"))
    return out


def _capture() -> list[Finding]:
    raw = env.text(env.CAPTURE)
    if raw is None:
        return []
    from mstx_marks.profiling.recipes import arm_from_text, armed

    # This process runs no loop: what activation armed here is undone, then the text is armed
    # by the run-time's own parser and undone again.
    for handle in armed():
        handle.undo()
    with _heard() as said:
        arm_from_text(raw)
    names = [handle.recipe.name for handle in armed()]
    for handle in armed():
        handle.undo()
    out = _ignored("capture", said)
    if names:
        out.append(Finding("ok", "capture", "recipes armed: " + ", ".join(names)))
    elif not said:
        out.append(Finding("stop", "capture", f"{env.CAPTURE}={env.quoted(raw)} arms no recipe"))
    return out


def _rank() -> list[Finding]:
    with _heard() as said:
        env.rank()
    return [Finding("warn", "rank", text) for text in said]


def _npu() -> list[Finding]:
    try:
        import torch_npu  # type: ignore[import-not-found,unused-ignore]
    except Exception as exc:
        return [Finding("warn", "torch_npu", f"does not import ({type(exc).__name__}: {exc})")]
    version = getattr(torch_npu, "__version__", "?")
    try:
        count = int(torch_npu.npu.device_count()) if torch_npu.npu.is_available() else 0
    except Exception as exc:
        return [Finding("warn", "torch_npu", f"{version} imports, but no NPU answers ({exc})")]
    if not count:
        return [Finding("warn", "torch_npu", f"{version} imports, but sees no NPU")]
    return [Finding("ok", "torch_npu", f"{version}, {count} NPU(s) visible")]


def _recorded_too() -> str:
    out = env.text(env.OUT)
    return f"; ranges are still recorded under {env.OUT}={out}" if out else ""


def _backend() -> list[Finding]:
    spec = str(_quiet_settings().get("backend", "auto"))
    if spec == "auto":
        # torch first, outside detect()'s lock: importing it runs the routing's re-detection
        # hook (armed when settings were resolved before torch, as MSTX_MARKS_OUT does at
        # import), which calls detect() itself and would wait on that lock for ever.
        with contextlib.suppress(Exception):
            importlib.import_module("torch")
        chosen = backends.detect(probe=True).name
        if chosen != "noop":
            return [Finding("ok", "backend", f"auto picks {chosen}")]
        if env.text(env.OUT) is not None:
            return [
                Finding(
                    "warn",
                    "backend",
                    "auto picks noop (no torch_npu with an NPU, no CUDA)" + _recorded_too(),
                )
            ]
        return [
            Finding(
                "stop",
                "backend",
                "auto picks noop: no torch_npu with an NPU and no CUDA here; set "
                f"{env.OUT}=DIR to record on this machine and write the ranges under DIR"
                f" ({env.BACKEND}=torch puts them in a torch.profiler capture instead)",
            )
        ]
    if spec == "noop":
        return [Finding("stop", "backend", f"{env.BACKEND}=noop records nothing")]
    try:  # what the run-time does (core.detection): create it, and use noop if that fails
        backend = backends.create(spec)
    except Exception as exc:
        return [
            Finding(
                "stop",
                "backend",
                f"{env.BACKEND}={spec} cannot work here ({exc}): the run warns and uses noop"
                + _recorded_too(),
            )
        ]
    if spec == "mstx" and not backend.device_present():
        return [
            Finding(
                "stop",
                "backend",
                f"{env.BACKEND}=mstx: torch_npu imports but sees no NPU, so no Ascend profiler "
                "receives the ranges" + _recorded_too(),
            )
        ]
    return [Finding("ok", "backend", f"{env.BACKEND}={spec}")]


def _filters() -> list[Finding]:
    found = _quiet_settings()
    out: list[Finding] = []
    ranks = found.get("ranks")
    if isinstance(ranks, tuple) and ranks and env.rank() not in ranks:
        out.append(
            Finding("stop", "ranks", f"this rank ({env.rank()}) is not in {env.RANKS}={ranks}")
        )
    include = found.get("include")
    if isinstance(include, tuple) and include and "default" not in include:
        out.append(
            Finding(
                "warn",
                "domains",
                f"{env.INCLUDE} has no 'default': ranges without a domain= are dropped",
            )
        )
    return out


def _profiler_config(path: str) -> list[Finding]:
    from mstx_marks.profiling.dynamic_profile import check_dynamic_profile_config

    target = Path(path)
    config = target / "profiler_config.json" if target.is_dir() else target
    if not config.is_file():
        return [Finding("stop", "profiler config", f"{config} does not exist")]
    problems = check_dynamic_profile_config(config)
    if not problems:
        return [Finding("ok", "profiler config", f"{config} runs as written, with MSTX on")]
    fatal = ("MSTX is off", "never starts", "no rank profiles")
    return [
        Finding(
            "stop" if any(f in p for f in fatal) else "warn", "profiler config", f"{config}: {p}"
        )
        for p in problems
    ]


def _out_folder() -> list[Finding]:
    """``MSTX_MARKS_OUT``: decided as every process of the job decides it, by making the folder
    and writing a probe file there (:func:`~mstx_marks.export.out.cannot_write`)."""
    out = env.text(env.OUT)
    if out is None:
        return []
    from mstx_marks.export.out import cannot_write

    existed = os.path.isdir(out)
    problem = cannot_write(out)
    name = f"{env.OUT}={env.shown(out)}"
    if problem is not None:
        return [Finding("stop", "files", f"{env.OUT}: {problem}; nothing is written")]
    made = "" if existed else " (made now)"
    return [Finding("ok", "files", f"{name} is a folder this user can write{made}")]


def _set_variables() -> list[Finding]:
    # MSTX_MARKS_RUN is the library's own: made by the first process of a job that records,
    # and inherited by what it starts; the user rarely sets it.
    seen = [v.name for v in env.VARIABLES if env.text(v.name) is not None and v.name != env.RUN]
    out = [Finding("ok", "environment", "set: " + ", ".join(seen))] if seen else []
    if env.run_id_given():  # not the one this process made (MSTX_MARKS_OUT at its import)
        text = f"{env.RUN}={env.quoted(env.text(env.RUN) or '')}: the job's run id (mstx_marks"
        out.append(Finding("ok", "environment", text + " sets it for the processes it starts)"))
    return out


def _unknown_names() -> list[Finding]:
    """A name with our prefix that is no variable (a typo): the run ignores it, and says so."""
    return [Finding("stop", "environment", f"{line} (the run would ignore it)")
            for line in env.unknown_names()]  # fmt: skip


def diagnose(profiler_config: str | None = None) -> list[Finding]:
    """Everything the doctor checks, in order; never raises.

    ``profiler_config``: a ``profiler_config.json`` (or its folder) for torch_npu's dynamic
    profiling, checked as torch_npu would read it.
    """
    findings: list[Finding] = []
    steps: list[Callable[[], list[Finding]]] = [
        _switches,
        _set_variables,
        _unknown_names,
        _routing_values,
        _record_capacity,
        _instrument,
        _sample,
        _capture,
        _rank,
        _npu,
        _backend,
        _filters,
    ]
    if profiler_config is not None:
        steps.append(lambda: _profiler_config(profiler_config))
    steps.append(_out_folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what the checks hear is in their findings
        for step in steps:
            try:
                findings += step()
            except Exception as exc:  # a check that breaks is itself a finding
                name = getattr(step, "__name__", "check").strip("_")
                findings.append(Finding("warn", name, f"check failed: {exc!r}"))
    return findings


def check_values(values: Mapping[str, str]) -> list[Finding]:
    """What the run-time would ignore of these ``MSTX_MARKS_*`` values (the ``stop`` findings
    of the value checks, as if the environment held them); ``mstx-marks run`` refuses them.

    >>> [f.topic for f in check_values({"MSTX_MARKS_INSTRUMENT": "vlm"})][:1]
    ['instrument']
    >>> check_values({"MSTX_MARKS_SAMPLE": "gen=every(2)"})
    []
    """
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = [*_routing_values(), *_instrument(), *_sample(), *_capture()]
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
    return [f for f in found if f.level == "stop"]


def verdict(findings: list[Finding]) -> str:
    """The doctor's last line: whether ranges reach the profiler, and if not the first reason."""
    stops = [f for f in findings if f.level == "stop"]
    if stops:
        return f"ranges would NOT reach the profiler: {stops[0].topic}: {stops[0].text}"
    backend = next((f.text for f in findings if f.topic == "backend"), "")
    if backend.endswith(("record", "torch")):
        return f"ranges would be recorded on this machine ({backend})"
    if backend.startswith("auto picks noop"):
        return f"ranges would be recorded on this machine, under {env.OUT}, and reach no profiler"
    host = " (host-only ranges are kept by MindStudio Insight; msprof-analyze's mstx_sum keeps"
    host += ' only ranges on a stream: stream="current")'
    return "ranges would reach the profiler" + host


def run_doctor(profiler_config: str | None = None, as_json: bool = False) -> int:
    """Print the findings and the verdict; exit status 1 when ranges would not get through.

    The doctor is no process of the job: what ``MSTX_MARKS_OUT`` started at its import (a
    recording, which would end by saying it recorded nothing) is dropped first, unwritten."""
    settings.reset()
    findings = diagnose(profiler_config)
    line = verdict(findings)
    if as_json:
        print(json.dumps({"findings": [f.__dict__ for f in findings], "verdict": line}, indent=2))
    else:
        for f in findings:
            print(f)
        print(line)
    return 1 if any(f.level == "stop" for f in findings) else 0
