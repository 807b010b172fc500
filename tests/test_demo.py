from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mstx_marks.analysis.summary import load_traces
from mstx_marks.cli import demo
from mstx_marks.cli.main import main as cli_main
from mstx_marks.export import read_ascend_db, read_chrome_trace

pytest.importorskip("torch")

STEPS, TOKENS = 2, 5


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "mstx_marks", "demo", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)


@pytest.fixture(scope="module")
def without_numpy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment where ``import numpy`` fails, as on a machine without it (numpy is no
    dependency of ours, and torch only warns when it is missing)."""
    hide = tmp_path_factory.mktemp("no_numpy")
    (hide / "numpy.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"
    )
    path = [str(hide), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


@pytest.fixture(scope="module")
def demo_run(
    tmp_path_factory: pytest.TempPathFactory, without_numpy: dict[str, str]
) -> tuple[Path, str, str]:
    out = tmp_path_factory.mktemp("demo") / "out"
    args = ("--ranks", "2", "--steps", str(STEPS), "--tokens", str(TOKENS), "--out", str(out))
    proc = _demo(*args, env=without_numpy)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout, proc.stderr


def test_demo_writes_every_output_and_prints_the_summary(
    demo_run: tuple[Path, str, str],
) -> None:
    out, stdout, _ = demo_run
    assert f"step {STEPS}/{STEPS}" in stdout  # progress
    for phase in ("generate_sequences", "vllm_one_step", "update_actor", "compute_ref_log_prob"):
        assert phase in stdout
    dbs = sorted(out.glob("ascend/*_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_*.db"))
    assert sorted(db.name for db in dbs) == [f"ascend_pytorch_profiler_{r}.db" for r in (0, 1)]
    # one Chrome trace per rank, named as MSTX_MARKS_OUT names them (role, rank, host, pid)
    chrome = sorted(p.name for p in (out / "chrome").iterdir())
    assert [n.split("-")[:2] for n in chrome] == [["mstx_marks", f"rank{r}"] for r in (0, 1)]
    assert json.loads((out / "trace.json").read_text())["otherData"]["generator"] == "mstx_marks"
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "update_actor" in page and "http" not in page
    hint = stdout[stdout.index("[demo] done") :]  # the closing lines name every summary output
    for option in ("--csv", "--json", "--svg", "--html", "--trace"):
        assert option in hint, option


def test_demo_outputs_agree_with_each_other(demo_run: tuple[Path, str, str]) -> None:
    out, _, _ = demo_run
    traces, errors, _ = load_traces(out / "ascend")
    assert errors == [] and [t.rank for t in traces] == [0, 1]
    merged = {t.rank: t for t in read_chrome_trace(out / "trace.json")}
    svg = ET.parse(out / "timeline.svg").getroot()
    for trace in traces:
        names = [r.name for r in trace.ranges]
        assert names.count("step") == STEPS and len(trace.steps) == STEPS
        # the decode window marks tokens 1 .. TOKENS-2 of each rollout
        assert names.count("vllm_one_step") == STEPS * (TOKENS - 2)
        assert {r.domain for r in trace.ranges if r.name == "vllm_one_step"} == {"vllm_one_step"}
        assert len({r.pid for r in trace.records}) == 1
        (chrome,) = (out / "chrome").glob(f"mstx_marks-rank{trace.rank}-*.trace.json")
        per_rank = read_chrome_trace(chrome)[0]
        assert per_rank.ranges == merged[trace.rank].ranges == trace.ranges
        bars = svg.findall(f".//{{*}}rect[@data-rank='{trace.rank}']")
        assert len(bars) == len(trace.ranges)
        assert trace.source is not None
        with sqlite3.connect(trace.source) as db:
            assert db.execute("SELECT COUNT(*) FROM STEP_TIME").fetchone() == (STEPS,)
    assert read_ascend_db(traces[0].source or "").records == traces[0].records


def test_demo_without_numpy_prints_no_numpy_warning(
    demo_run: tuple[Path, str, str], without_numpy: dict[str, str]
) -> None:
    # The environment does reproduce the warning: torch itself still gives it there.
    control = subprocess.run(
        [sys.executable, "-c", "import torch"],
        capture_output=True,
        text=True,
        timeout=120,
        env=without_numpy,
    )
    assert "Failed to initialize NumPy" in control.stderr
    _, _, stderr = demo_run
    assert "NumPy" not in stderr, stderr


def test_demo_reports_progress_per_rank_and_step(demo_run: tuple[Path, str, str]) -> None:
    _, stdout, _ = demo_run
    done = re.findall(rf"rank (\d+): step (\d+)/{STEPS} done in \d+\.\d+ s", stdout)
    assert sorted(done) == [(str(r), str(s)) for r in range(2) for s in range(1, STEPS + 1)]
    assert sorted(re.findall(r"rank (\d+): ready in \d", stdout)) == ["0", "1"]


def test_symmetric_demo_has_balanced_steps(
    demo_run: tuple[Path, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Every rank does the same work, so no rank should be blamed. The first optimizer build (a
    # lazy import of seconds) used to run after the start barrier, so one rank's step 1 began
    # up to 2 s before the other's and the step imbalance was 2.4 or more. The ranks meet in
    # collectives every step, so even on a loaded 2-core machine it stays near 1 (1.0-1.2 seen).
    out, _, _ = demo_run
    assert cli_main(["summary", str(out), "--json"]) == 0
    phases = {p["name"]: p for p in json.loads(capsys.readouterr().out)["phases"]}
    assert set(phases["step"]["ranks"]) == {"0", "1"}
    assert phases["step"]["imbalance"] < 1.5, phases["step"]


def test_demo_refuses_a_folder_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    proc = _demo("--ranks", "1", "--steps", "1", "--out", str(tmp_path))
    assert proc.returncode != 0 and "not empty" in proc.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_demo_rejects_bad_arguments() -> None:
    proc = _demo("--ranks", "0")
    assert proc.returncode == 2 and "--ranks" in proc.stderr


class _FakeRank:
    """A worker process: rank 0 blocks (as in a collective) and ignores SIGTERM; rank 1 dies."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.rank = int(env["RANK"])
        self.returncode: int | None = None
        self.signals: list[str] = []

    def poll(self) -> int | None:
        if self.rank == 1:
            self.returncode = 1
        return self.returncode

    def terminate(self) -> None:
        self.signals.append("TERM")

    def kill(self) -> None:
        self.signals.append("KILL")
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if timeout is None:
                raise AssertionError("waited without a timeout on a rank that ignores SIGTERM")
            raise subprocess.TimeoutExpired("rank", timeout)
        return self.returncode


def test_a_failed_rank_stops_the_run_while_another_is_still_blocked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # any() stopped polling at the first rank still running, so rank 1's failure went unseen
    # until rank 0 gave up on its collective; and wait() without a timeout could hang for ever.
    spawned: list[_FakeRank] = []
    monkeypatch.setattr(
        demo.subprocess,
        "Popen",
        lambda cmd, env: spawned.append(_FakeRank(cmd, env)) or spawned[-1],
    )
    sleeps = iter(range(100))
    monkeypatch.setattr(demo.time, "sleep", lambda _: next(sleeps))  # StopIteration: never noticed
    args = argparse.Namespace(ranks=2, steps=1, tokens=4, timeout=10**9)
    assert demo._run_ranks(args, Path("unused")) == 1
    assert "rank 1 failed" in capsys.readouterr().err
    assert spawned[0].signals == ["TERM", "KILL"] and spawned[1].signals == []
