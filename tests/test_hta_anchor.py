"""HolisticTraceAnalysis (HTA) as an outside anchor for the per-step figures (issue 36): HTA's
own parse of a trace file, and per step the union of the time its annotations cover, against
``mstx-marks summary --json`` of the same files, to 1 us.

- On the Kineto captures in ``../shared/realcap/hta_kineto`` (HTA's own test data): the steps
  are HTA's (the host's ``ProfilerStep#N`` and the ``iteration`` it gives them); the annotations
  are the user's, as in summary's busy time, which leaves PyTorch's own (``nccl:*``,
  ``Optimizer.step#*``, ...: those summary lists as ``automatic``) out.
- On our Chrome traces (``mstx-marks export`` of a job of tests/support/oracle.py): HTA finds no
  step there (no ``ProfilerStep#N``), so the steps are the reference process's step ranges as
  HTA parsed them; HTA's union, summary's busy time and the oracle's truth agree, each file
  placed by its ``otherData.origin_ns`` (HTA keeps it in its metadata of the file and never
  applies it) and also by HTA alone: every file of a job has its origin on one grid
  (``mstx_marks.export.chrome.origin_of``), so HTA puts them on one axis.

The union arithmetic is this file's; every time in it is HTA's (read with its sub-microsecond
digits: tests/engines/hta_events.py). HTA 0.5.0, its latest, predates pandas 3, which this
environment has: it runs with pandas < 3 in its own venv (tests/support/engine_venvs.py,
``hta``), and these tests are marked ``engine`` (tests/conftest.py refuses an unmarked test that
reaches an engine venv).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
from support import engine_venvs
from support.engine_run import ENGINES, clean_env
from support.oracle import SHAPES, US, Job, covered, write_spills
from test_realcap import capture

from mstx_marks.cli.main import main

pytestmark = pytest.mark.engine

#: A range as HTA parsed it: name, category, start and length (us, HTA's axis), HTA's iteration.
Row = tuple[str, str, float, float, int]
#: HTA's step annotation on the host (Kineto's ``cat`` for the user's: ``user_annotation``).
PROFILER_STEP = re.compile(r"ProfilerStep\s*#\s*\d+")
USER_ANNOTATION = "user_annotation"
#: Our Chrome files put a range's domain in ``cat``: the oracle writes every range in this one.
OUR_DOMAIN = "default"


@dataclass
class Parsed:
    """One file as HTA parsed it: its host events, and where HTA's time 0 lies on the axis of
    the file's ``otherData.origin_ns`` (as HTA's metadata of the file holds it; None without)."""

    rows: list[Row]
    origin_ns: Optional[int]

    def spans(self, names: set[str], placed: bool = False) -> list[tuple[int, int]]:
        """The ranges of ``names`` (ns), on HTA's axis or, ``placed``, on the origin's."""
        at = self.origin_ns if placed and self.origin_ns is not None else 0
        return [(at + ns(ts), at + ns(ts + dur)) for n, _, ts, dur, _ in self.rows if n in names]


def hta(tmp_path: Path, files: dict[str, Path], cats: Iterable[str]) -> dict[str, Parsed]:
    """What HTA parsed of ``files`` (one HTA rank each, by key): each one's host events of
    ``cats``."""
    try:
        python = engine_venvs.engine_venv("hta")
    except engine_venvs.EngineVenvError as ex:
        pytest.skip(f"the 'hta' venv cannot be built here: {ex}")
    request, result = tmp_path / "hta_request.json", tmp_path / "hta_result.json"
    paths = {key: str(path) for key, path in files.items()}
    request.write_text(json.dumps({"files": paths, "cats": list(cats)}))
    argv = [str(python), str(ENGINES / "hta_events.py"), str(request), str(result)]
    proc = subprocess.run(
        argv, env=clean_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(result.read_text())
    assert doc["version"] == "0.5.0"
    # HTA's ts are the file's less the earliest of all: the origin's axis is theirs plus both.
    shift = ns(doc["min_ts_us"])
    return {
        key: Parsed(
            [tuple(row) for row in found["rows"]],
            None if found["origin_ns"] is None else int(found["origin_ns"]) + shift,
        )
        for key, found in doc["files"].items()
    }


def ns(us: float) -> int:
    """HTA's microseconds (floats) in ns."""
    return round(us * 1000)


def near(got: list[int], want: list[int]) -> bool:
    return len(got) == len(want) and all(abs(g - w) <= US for g, w in zip(got, want))


def summary_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["summary", "--json", "--jobs", "1", str(path)]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert doc["errors"] == []
    return doc


KINETO = [
    "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",  # 5 steps, the user's forward/backward/...
    "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",  # 1 step, only PyTorch's gloo ranges
    "mi250_minitoy_train_ROCm6_2.pt.trace.json.gz",  # 2 steps, and a device copy of one
]


@pytest.mark.parametrize("name", KINETO)
def test_hta_reads_the_steps_and_busy_time_summary_reads_of_kineto(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = capture("hta_kineto", name)
    doc = summary_json(path, capsys)
    (process,) = doc["per_step"]["processes"]
    steps = doc["per_step"]["steps"]
    (parsed,) = hta(tmp_path, {"0": path}, [USER_ANNOTATION]).values()
    marks = sorted((ts, dur, it) for n, _, ts, dur, it in parsed.rows if PROFILER_STEP.fullmatch(n))
    # HTA's steps: its iteration numbers, where they start (from the first) and how long.
    assert [str(it) for _, _, it in marks] == [s["key"] for s in steps]
    first, ours = ns(marks[0][0]), steps[0]["start_ns"]
    assert near([ns(ts) - first for ts, _, _ in marks], [s["start_ns"] - ours for s in steps])
    assert near([ns(dur) for _, dur, _ in marks], process["length_ns"])
    # The user's annotations, each step's union and each phase's.
    mine = {p["name"] for p in doc["phases"] if not p["automatic"] and not p["is_step"]}
    assert mine == set(process["phases"])
    bounds = [(ns(ts), ns(ts + dur)) for ts, dur, _ in marks]
    assert near([covered(parsed.spans(mine), a, b) for a, b in bounds], process["busy_ns"])
    for phase in mine:
        hta_phase = [covered(parsed.spans({phase}), a, b) for a, b in bounds]
        assert near(hta_phase, process["phases"][phase]), phase


def _exported(shape: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[
    Job, dict[str, Any], dict[str, Parsed]
]:  # fmt: skip
    """An oracle job exported, ``summary --json`` of its Chrome files, and HTA's parse of them."""
    job = SHAPES[shape]()
    write_spills(job, tmp_path / "job")
    assert main(["export", str(tmp_path / "job")]) == 0
    chrome = tmp_path / "job" / "chrome"
    doc = summary_json(chrome, capsys)  # the Chrome files alone: what HTA reads
    sources = {key: Path(rank["source"]) for key, rank in doc["ranks"].items()}
    assert {p.parent for p in sources.values()} == {chrome} and len(sources) == len(job.procs)
    return job, doc, hta(tmp_path, sources, [OUR_DOMAIN])


def _busy(
    doc: dict[str, Any], found: dict[str, Parsed], placed: bool
) -> tuple[list[tuple[int, int]], dict[str, list[int]]]:
    """The steps (the reference process's step ranges as HTA parsed them) and each process's
    busy time in each: HTA's union of its ranges (not the steps)."""
    reference = doc["per_step"]["reference"]["key"]
    (step_name,) = {
        p["name"]
        for p in doc["phases"]
        if p["is_step"] and p["role"] == doc["per_step"]["reference"]["role"]
    }
    marks = sorted(found[reference].spans({step_name}, placed))
    busy = {}
    for key, parsed in found.items():
        names = {row[0] for row in parsed.rows} - ({step_name} if key == reference else set())
        busy[key] = [covered(parsed.spans(names, placed), a, b) for a, b in marks]
    return marks, busy


@pytest.mark.parametrize("shape", ["sync_grpo", "edges"])
def test_hta_reads_our_chrome_traces_as_summary_and_the_truth(
    shape: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each file placed by its ``otherData.origin_ns`` (from HTA's metadata of it)."""
    job, doc, found = _exported(shape, tmp_path, capsys)
    assert all(it == -1 for parsed in found.values() for *_, it in parsed.rows)  # no step found
    marks, busy = _busy(doc, found, placed=True)
    t0 = job.truth.steps[0].start
    assert near([a - marks[0][0] for a, _ in marks], [s.start - t0 for s in job.truth.steps])
    assert near([b - a for a, b in marks], [s.end - s.start for s in job.truth.steps])
    assert near([b - a for a, b in marks], [s["length_ns"] for s in doc["per_step"]["steps"]])
    for process in doc["per_step"]["processes"]:
        truth = job.truth.process(process["role"], process["rank"]).busy
        got = busy[process["key"]]
        assert near(got, process["busy_ns"]) and near(got, truth), (process["key"], got, truth)


def test_hta_alone_places_the_files_of_one_job_on_one_axis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """HTA reads each file's ``ts`` on their own (it never applies ``otherData.origin_ns``): the
    files of one job, whose first ranges lie up to 0.9 s apart here, still line up, since their
    origins lie on one grid of 10^6 s (``edges``, whose worker starts 50 ms before a line of
    that grid, is the rare job that straddles one: its files' origins differ by the grid)."""
    job, doc, found = _exported("sync_grpo", tmp_path, capsys)
    files = (tmp_path / "job" / "chrome").glob("*.trace.json")
    assert len({json.loads(p.read_text())["otherData"]["origin_ns"] for p in files}) == 1
    _, busy = _busy(doc, found, placed=False)
    for process in doc["per_step"]["processes"]:
        truth = job.truth.process(process["role"], process["rank"]).busy
        assert near(busy[process["key"]], truth), (process["key"], busy[process["key"]], truth)
