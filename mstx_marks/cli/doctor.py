"""``mstx-marks doctor``: would ranges from this machine and environment reach the profiler?

Checks what decides it, in the order it is decided: the off switch and the disable flag, the
environment's settings, torch_npu and an NPU, the backend ``auto`` picks, the rank and domain
filters, and a profiler config when one is given. Each finding is ``ok``, ``warn`` (ranges get
through, but something is lost or worth knowing) or ``stop`` (no range reaches the profiler),
and the last line says the verdict in plain words. It never raises: a broken install is what it
is for.

>>> import os
>>> os.environ["MSTX_MARKS_BACKEND"] = "record"
>>> [f.level for f in diagnose() if f.topic == "backend"]
['ok']
>>> del os.environ["MSTX_MARKS_BACKEND"]
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mstx_marks.backends import detect
from mstx_marks.base import env
from mstx_marks.core import routing as settings

__all__ = ["Finding", "diagnose", "verdict"]

Level = Literal["ok", "warn", "stop"]


@dataclass(frozen=True)
class Finding:
    """One thing the doctor looked at, and what it found."""

    level: Level
    topic: str
    text: str

    def __str__(self) -> str:
        return f"[{self.level:4}] {self.topic}: {self.text}"


def _settings_from_env() -> dict[str, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return settings.settings_from_env()


def _environment() -> list[Finding]:
    out: list[Finding] = []
    if env.off():
        out.append(
            Finding("stop", "off switch", f"{env.OFF}=1: every range is off in this process")
        )
    if env.text(env.DISABLE) is not None and env.flag(env.DISABLE):
        out.append(Finding("stop", "disabled", f"{env.DISABLE} switches every range off"))
    seen = [v.name for v in env.VARIABLES if env.text(v.name) is not None]
    with warnings.catch_warnings(record=True) as bad:
        warnings.simplefilter("always")
        from mstx_marks.base import diagnostics

        diagnostics.forget_warnings()  # the readers warn once: the doctor wants to hear them
        settings.settings_from_env()
        env.positive_int(env.RECORD_CAPACITY, 1)
        env.rank()
    for w in bad:
        out.append(Finding("warn", "environment", str(w.message).removeprefix("mstx_marks: ")))
    if seen and not bad:
        out.append(Finding("ok", "environment", "set: " + ", ".join(seen)))
    return out


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


def _backend() -> list[Finding]:
    spec = _settings_from_env().get("backend", "auto")
    if spec == "auto":
        chosen = detect(probe=True).name
        if chosen == "noop":
            return [
                Finding(
                    "stop",
                    "backend",
                    "auto picks noop: no torch_npu with an NPU and no CUDA here; set "
                    f"{env.BACKEND}=record (or torch) to record on this machine",
                )
            ]
        return [Finding("ok", "backend", f"auto picks {chosen}")]
    if spec == "noop":
        return [Finding("stop", "backend", f"{env.BACKEND}=noop records nothing")]
    return [Finding("ok", "backend", f"{env.BACKEND}={spec}")]


def _filters() -> list[Finding]:
    found = _settings_from_env()
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


def diagnose(profiler_config: str | None = None) -> list[Finding]:
    """Everything the doctor checks, in order; never raises.

    ``profiler_config``: a ``profiler_config.json`` (or its folder) for torch_npu's dynamic
    profiling, checked as torch_npu would read it.
    """
    findings: list[Finding] = []
    steps = [_environment, _npu, _backend, _filters]
    for step in steps:
        try:
            findings += step()
        except Exception as exc:  # a check that breaks is itself a finding
            findings.append(Finding("warn", step.__name__.strip("_"), f"check failed: {exc!r}"))
    if profiler_config is not None:
        findings += _profiler_config(profiler_config)
    if env.text(env.OUT) is not None:
        out = env.text(env.OUT) or ""
        writable = os.access(out if os.path.isdir(out) else os.path.dirname(out) or ".", os.W_OK)
        findings.append(
            Finding(
                "ok" if writable else "stop",
                "files",
                f"{env.OUT}={out} is {'writable' if writable else 'not writable'}",
            )
        )
    return findings


def verdict(findings: list[Finding]) -> str:
    """The doctor's last line: whether ranges reach the profiler, and if not the first reason."""
    stops = [f for f in findings if f.level == "stop"]
    if stops:
        return f"ranges would NOT reach the profiler: {stops[0].topic}: {stops[0].text}"
    backend = next((f.text for f in findings if f.topic == "backend"), "")
    if backend.endswith(("record", "torch")):
        return f"ranges would be recorded on this machine ({backend})"
    host = " (host-only ranges are kept by MindStudio Insight; msprof-analyze's mstx_sum keeps"
    host += ' only ranges on a stream: stream="current")'
    return "ranges would reach the profiler" + host


def run_doctor(profiler_config: str | None = None, as_json: bool = False) -> int:
    """Print the findings and the verdict; exit status 1 when ranges would not get through."""
    findings = diagnose(profiler_config)
    line = verdict(findings)
    if as_json:
        print(json.dumps({"findings": [f.__dict__ for f in findings], "verdict": line}, indent=2))
    else:
        for f in findings:
            print(f)
        print(line)
    return 1 if any(f.level == "stop" for f in findings) else 0
