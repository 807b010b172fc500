"""The README's "your own program" path, end to end, in a fresh interpreter, without torch:
decorate a function, ask for files, and get a non-empty trace, summary and picture."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_block(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    return re.search(r"```python[^\n]*\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_own_program_from_the_readme(tmp_path: Path) -> None:
    program = _readme_block("Your own loop needs no torch")
    (tmp_path / "train.py").write_text(program)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent / "support")  # blocks torch
    without_torch = "import no_torch, runpy; runpy.run_path('train.py', run_name='__main__')"
    run = subprocess.run(
        [sys.executable, "-c", without_torch],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "recorded no ranges" not in run.stderr
    traces = list((tmp_path / "out" / "chrome").glob("*.trace.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert {e["name"] for e in events if e.get("ph") == "X"} >= {"train_step", "forward"}
    summary = subprocess.run(
        [sys.executable, "-m", "mstx_marks", "summary", "out", "--json", "--svg", "out/t.svg"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert summary.returncode == 0, summary.stderr
    phases = {p["name"]: p for p in json.loads(summary.stdout)["phases"]}
    assert phases["train_step"]["all"]["count"] == 3
    assert phases["forward"]["all"]["count"] == 3
    assert (tmp_path / "out" / "t.svg").stat().st_size > 0
