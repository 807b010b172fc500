"""mstx-marks doctor (mstx_marks/doctor.py): the verdict and its first reason, for each case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.torch_npu_double import install_double

from mstx_marks.cli.doctor import diagnose, verdict
from mstx_marks.profiling.dynamic_profile import dynamic_profile_config


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for k in list(os.environ):
        if k.startswith("MSTX_MARKS_") or k == "RANK":
            monkeypatch.delenv(k)


def test_a_cpu_machine_with_nothing_set_says_no_backend_listens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clean_env(monkeypatch)
    findings = diagnose()
    line = verdict(findings)
    assert line.startswith("ranges would NOT reach the profiler: backend: auto picks noop")
    assert any(f.topic == "torch_npu" and "does not import" in f.text for f in findings)


def test_an_npu_host_reaches_the_profiler(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    with install_double(npu_available=True):
        findings = diagnose()
    assert [f.level for f in findings if f.topic in ("torch_npu", "backend")] == ["ok", "ok"]
    assert "auto picks mstx" in str(findings)
    assert verdict(findings).startswith("ranges would reach the profiler")


@pytest.mark.parametrize(
    ("variables", "reason"),
    [
        ({"MSTX_MARKS_OFF": "1"}, "off switch"),
        ({"MSTX_MARKS_DISABLE": "yes"}, "disabled"),
        ({"MSTX_MARKS_BACKEND": "noop"}, "backend"),
        ({"MSTX_MARKS_BACKEND": "record", "MSTX_MARKS_RANKS": "1,2", "RANK": "0"}, "ranks"),
    ],
)
def test_each_reason_ranges_stop_is_named_first(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], reason: str
) -> None:
    _clean_env(monkeypatch)
    for k, v in variables.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("mstx_marks.base.env._off", [])  # the switch is read once per process
    line = verdict(diagnose())
    assert line.startswith(f"ranges would NOT reach the profiler: {reason}:"), line


def test_bad_settings_are_named_with_value_and_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    monkeypatch.setenv("MSTX_MARKS_RECORD_CAPACITY", "1e5")
    monkeypatch.setenv("MSTX_MARKS_INCLUDE", "verl")
    findings = diagnose()
    texts = [f.text for f in findings if f.level == "warn"]
    assert any("MSTX_MARKS_RECORD_CAPACITY" in t and "'1e5'" in t for t in texts), texts
    assert any("no 'default'" in t for t in texts)
    assert verdict(findings).startswith("ranges would be recorded on this machine")


def test_a_profiler_config_with_mstx_off_stops(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _clean_env(monkeypatch)
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    (tmp_path / "profiler_config.json").write_text(json.dumps({"activities": ["CPU"]}))
    findings = diagnose(str(tmp_path))
    assert verdict(findings).startswith("ranges would NOT reach the profiler: profiler config")
    assert any(f.level == "stop" and "MSTX is off" in f.text for f in findings)
    good = tmp_path / "good"
    dynamic_profile_config(good)
    findings = diagnose(str(good))
    assert any(f.topic == "profiler config" and f.level == "ok" for f in findings)


def test_the_command_exits_1_when_ranges_stop_and_prints_json() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mstx_marks", "doctor", "--json"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "MSTX_MARKS_BACKEND": "noop"},
        cwd="/",
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["verdict"].startswith("ranges would NOT reach the profiler: backend")
