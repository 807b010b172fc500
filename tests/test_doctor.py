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
    # What to do is what writes something: MSTX_MARKS_OUT (the record backend alone keeps the
    # ranges in memory, and the process ends with them).
    (backend,) = [f for f in findings if f.topic == "backend"]
    assert "MSTX_MARKS_OUT=DIR" in backend.text and "=record" not in backend.text


def test_the_run_id_the_library_set_is_not_listed_as_the_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clean_env(monkeypatch)
    monkeypatch.setenv("MSTX_MARKS_RUN", "20260101-000000-ab12")
    monkeypatch.setenv("MSTX_MARKS_OUT", "prof")
    said = [f.text for f in diagnose() if f.topic == "environment"]
    assert "set: MSTX_MARKS_OUT" in said
    assert any(
        t.startswith("MSTX_MARKS_RUN='20260101-000000-ab12': the job's run id") for t in said
    )


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
    stops = [f.text for f in findings if f.level == "stop"]
    assert any("MSTX_MARKS_RECORD_CAPACITY" in t and "'1e5'" in t for t in stops), stops
    assert any("no 'default'" in f.text for f in findings if f.level == "warn")
    assert verdict(findings).startswith("ranges would NOT reach the profiler: environment:")


def test_a_good_recording_setup_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    monkeypatch.setenv("MSTX_MARKS_RECORD_CAPACITY", "5000")
    monkeypatch.setenv("MSTX_MARKS_SAMPLE", "vllm_one_step=window(30,70)")
    findings = diagnose()
    assert not [f for f in findings if f.level == "stop"], findings
    assert verdict(findings).startswith("ranges would be recorded on this machine")


@pytest.mark.parametrize(
    ("variables", "topic", "words"),
    [
        # The run-time warns and uses noop for each of these two.
        ({"MSTX_MARKS_BACKEND": "mstx"}, "backend", "torch_npu does not import"),
        ({"MSTX_MARKS_BACKEND": "nvtx"}, "backend", "CUDA is not available"),
        ({"MSTX_MARKS_BACKEND": "garbage"}, "environment", "unknown backend 'garbage'"),
        ({"MSTX_MARKS_SAMPLE": "garbage"}, "sample", "expected PHASE=POLICY"),
        ({"MSTX_MARKS_SAMPLE": "gen=sometimes"}, "sample", "'gen=sometimes'"),
        ({"MSTX_MARKS_INSTRUMENT": "vlm"}, "instrument", "'vlm'"),
        ({"MSTX_MARKS_CAPTURE": "rollout_decod:active=2"}, "capture", "unknown recipe"),
        ({"MSTX_MARKS_CAPTURE": "rollout_decode:wiat=2"}, "capture", "unknown key 'wiat'"),
        ({"MSTX_MARKS_RECORD_CAPACITY": "0"}, "environment", "its default, 1000000 events"),
        ({"MSTX_MARKS_DISABLE": "maybe"}, "environment", "MSTX_MARKS_DISABLE='maybe'"),
    ],
)
def test_every_setting_the_run_would_not_honour_stops(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], topic: str, words: str
) -> None:
    _clean_env(monkeypatch)
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    for k, v in variables.items():
        monkeypatch.setenv(k, v)
    findings = diagnose()
    stops = [f for f in findings if f.level == "stop"]
    assert stops and stops[0].topic == topic and words in stops[0].text, findings
    assert verdict(findings).startswith(f"ranges would NOT reach the profiler: {topic}:")


def test_a_recipe_that_parses_is_armed_and_undone(monkeypatch: pytest.MonkeyPatch) -> None:
    from mstx_marks.profiling.recipes import armed

    _clean_env(monkeypatch)
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    monkeypatch.setenv("MSTX_MARKS_CAPTURE", "rollout_decode:wait=1,active=2")
    findings = diagnose()
    assert [f.text for f in findings if f.topic == "capture"] == ["recipes armed: rollout_decode"]
    assert not [c for c in armed() if not c.done]


def test_the_out_folder_must_be_a_folder_that_can_be_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _clean_env(monkeypatch)
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = {
        str(a_file): f"cannot write {a_file}: it is a file",
        str(a_file / "below"): f"cannot write {a_file / 'below'}: {a_file} is a file",
        # As root access() says yes here; making the folder says no (issue 37).
        "/proc/nope": "cannot write /proc/nope: /proc takes no new folders",
    }
    for out, words in cases.items():
        monkeypatch.setenv("MSTX_MARKS_OUT", out)
        found = [f for f in diagnose() if f.topic == "files"]
        assert [f.level for f in found] == ["stop"] and words in found[0].text, found
        assert "will be created" not in found[0].text and "writable" not in found[0].text
    new = tmp_path / "new" / "prof"
    monkeypatch.setenv("MSTX_MARKS_OUT", str(new))
    found = [f for f in diagnose() if f.topic == "files"]
    assert [f.level for f in found] == ["ok"] and "can write (made now)" in found[0].text
    assert new.is_dir()  # decided by making it


def test_check_values_names_what_the_run_would_ignore() -> None:
    from mstx_marks.cli.doctor import check_values

    bad = check_values({"MSTX_MARKS_SAMPLE": "garbage", "MSTX_MARKS_INSTRUMENT": "verl"})
    assert [f.topic for f in bad] == ["sample"]
    assert check_values({"MSTX_MARKS_INSTRUMENT": "verl,vllm"}) == []
    import os

    assert "MSTX_MARKS_SAMPLE" not in os.environ


def test_out_with_the_auto_backend_does_not_hang(tmp_path: Path) -> None:
    """MSTX_MARKS_OUT activates at import and arms the re-detection on torch's import; the
    doctor's probe imports torch and must not wait on the detection's lock for ever."""
    proc = subprocess.run(
        [sys.executable, "-m", "mstx_marks", "doctor"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "MSTX_MARKS_OUT": str(tmp_path / "prof")},
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"MSTX_MARKS_OUT={tmp_path / 'prof'} is a folder this user can write" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("ranges would be recorded on this machine")


def test_the_doctor_under_out_says_nothing_about_itself(tmp_path: Path) -> None:
    """Issue 37: its import under MSTX_MARKS_OUT made it record, and it ended saying that it
    recorded no ranges; and the run id its import made was listed as if the user had set it.
    A run id the doctor was given (by the launcher, the user) is still shown."""
    base = {"PATH": "/usr/bin:/bin", "MSTX_MARKS_OUT": str(tmp_path / "prof")}
    for given in (None, "20260101-000000-ab12"):
        environ = base if given is None else {**base, "MSTX_MARKS_RUN": given}
        proc = subprocess.run(
            [sys.executable, "-m", "mstx_marks", "doctor"],
            capture_output=True,
            text=True,
            env=environ,
            cwd=tmp_path,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "mstx_marks:" not in proc.stderr, proc.stderr  # no warning about itself
        run_lines = [line for line in proc.stdout.splitlines() if "MSTX_MARKS_RUN" in line]
        if given is None:
            assert run_lines == [], proc.stdout
        else:
            assert len(run_lines) == 1 and given in run_lines[0], proc.stdout
    assert not list((tmp_path / "prof").rglob("*.jsonl"))  # the doctor recorded nothing


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
