"""``mstx-marks`` / ``python -m mstx_marks``: dispatch, usage errors, help, and a closed pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mstx_marks.cli.main import COMMANDS, main


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name}" in out for name in COMMANDS)


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: mstx-marks" in capsys.readouterr().err


def test_unknown_command_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["phasez"]) == 2
    assert "invalid choice: 'phasez'" in capsys.readouterr().err


def test_dispatches_to_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["phases"]) == 0
    assert capsys.readouterr().out.split()[:3] == ["name", "domain", "emitted"]


def test_version_and_one_prog(capsys: pytest.CaptureFixture[str]) -> None:
    import mstx_marks

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"mstx-marks {mstx_marks.__version__}"
    for name in COMMANDS:
        assert main([name, "--help"]) == 0
        assert capsys.readouterr().out.startswith(f"usage: mstx-marks {name}")


def test_every_option_has_help_text() -> None:
    from mstx_marks.cli.main import _parser

    parser = _parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():  # type: ignore[union-attr]
        for action in command._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.option_strings or action.dest} has no help"


def test_import_mstx_marks_imports_no_argparse_or_difflib() -> None:
    code = "import sys, mstx_marks; print(sorted({'argparse', 'difflib'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_closed_pipe_ends_quietly() -> None:
    # `python -m mstx_marks phases | head -1`: the reader leaves after one line.
    # The child writes far more than a pipe holds, so it must meet the closed pipe.
    # It stops at the first call that meets it (the 141), not after all 3000.
    child = (
        "import sys; from mstx_marks.cli.main import main;"
        "sys.exit(next((rc for rc in (main(['phases']) for _ in range(3000)) if rc), 0))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err, err


def test_docstring_examples_pass_without_torch(tmp_path: Path) -> None:
    """`pytest mstx_marks` on a machine without torch: the torch examples skip, the rest pass."""
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(repo / "tests"))
    args = ["-q", "-p", "no:cacheprovider", "-p", "support.no_torch", "mstx_marks"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    skipped = "SKIPPED [3] mstx_marks/profiling/profiler.py: this example builds a torch profiler"
    assert skipped in proc.stdout
    assert " failed" not in proc.stdout


# --- coverage, demo, run: what a user types wrong is said, not guessed -----------------------


def test_coverage_needs_expect(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["coverage", str(tmp_path)]) == 2
    assert "the following arguments are required: --expect" in capsys.readouterr().err


def test_coverage_refuses_a_mistyped_expectation(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["coverage", str(tmp_path), "--expect", "verl-gpro"]) == 2
    err = capsys.readouterr().err
    assert "'verl-gpro' is no expectation" in err and "did you mean 'verl-grpo'?" in err
    assert main(["coverage", str(tmp_path), "--expect", "verl-grpo+vlm-x"]) == 2
    assert "'vlm-x'" in capsys.readouterr().err


def test_coverage_of_a_folder_without_traces_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["coverage", str(tmp_path), "--expect", "verl-grpo"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "no trace" in err


def test_demo_help_shows_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--help"]) == 0
    out = capsys.readouterr().out
    for words in ("(default 2)", "(default 4)", "(default 16)", "(default demo-out)",
                  "(default 300)"):  # fmt: skip
        assert words in out, words
    assert "--worker" not in out  # internal


def test_run_refuses_values_the_job_would_ignore(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    assert main(["run", "--instrument", "verl", "--sample", "garbage", "--", *command]) == 2
    err = capsys.readouterr().err
    assert "MSTX_MARKS_SAMPLE='garbage'" in err and "nothing was started" in err
    assert main(["run", "--capture", "rollout_decod:active=1", "--", *command]) == 2
    assert "unknown recipe 'rollout_decod'" in capsys.readouterr().err
    assert not marker.exists()


def test_warnings_with_no_user_line_name_the_library(tmp_path: Path) -> None:
    """At a launched process's start-up (sitecustomize, under `<frozen site>`) and in an exit
    hook (`sys:1`) no line of the user's is on the stack."""
    import mstx_marks.launch

    startup = Path(mstx_marks.launch.__file__).parent / "_startup"  # what `run` puts first
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    env.update(
        MSTX_MARKS_INSTRUMENT="vlm", PYTHONPATH=f"{startup}{os.pathsep}{env.get('PYTHONPATH', '')}"
    )
    proc = subprocess.run(
        [sys.executable, "-c", "pass"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert "<mstx_marks>:0: MstxMarksWarning: mstx_marks: ignoring 'vlm'" in proc.stderr
    assert "<frozen" not in proc.stderr
    late = "import atexit; from mstx_marks.base.diagnostics import warn; atexit.register(warn, 'x')"
    proc = subprocess.run([sys.executable, "-c", late], capture_output=True, text=True, timeout=60)
    assert "mstx_marks: x" in proc.stderr and "sys:1" not in proc.stderr, proc.stderr


def test_the_reference_page_lists_every_command_and_option() -> None:
    from mstx_marks.cli.main import markdown_reference

    page = markdown_reference()
    for name in COMMANDS:
        assert f"## `mstx-marks {name}`" in page
    assert "--step-key KEY" in page and "--expect SPEC" in page
