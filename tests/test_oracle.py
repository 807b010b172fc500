"""The per-step model against jobs whose true figures are known (tests/support/oracle.py): each
shape written as our own spills, every figure read back as a user reads it (``mstx-marks
summary --json``, the text table, and ``mstx-marks export`` followed by ``summary --json``)
and compared with the truth to 1 us."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.oracle import (
    ANCHOR,
    MS,
    SHAPES,
    Job,
    StepTruth,
    mismatches,
    on_host,
    sync_grpo,
    write_spills,
)

from mstx_marks.analysis.readers import stream
from mstx_marks.cli.main import main


def _summary(folder: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    capsys.readouterr()
    assert main(["summary", *flags, "--jobs", "1", str(folder)]) == 0
    return capsys.readouterr().out


def _job(name: str, folder: Path) -> Job:
    job = SHAPES[name]()
    write_spills(job, folder)
    return job


@pytest.mark.parametrize("name", list(SHAPES))
def test_summary_json_is_the_truth(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(name, tmp_path)
    doc = json.loads(_summary(tmp_path, capsys, "--json"))
    assert mismatches(doc, job.truth) == []


@pytest.mark.parametrize("name", list(SHAPES))
def test_export_then_summary_is_the_truth(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After ``export`` the databases are read (they win over the spills): the same figures,
    the tokens and requests the model steps carried (``MSTX_ARGS``) and the step edges no
    model-step run is joined across included."""
    job = _job(name, tmp_path)
    assert main(["export", str(tmp_path)]) == 0
    assert list(tmp_path.glob("ascend/*/ASCEND_PROFILER_OUTPUT/*.db"))
    doc = json.loads(_summary(tmp_path, capsys, "--json"))
    assert all(".db" in source for source in (r["source"] for r in doc["ranks"].values()))
    assert mismatches(doc, job.truth) == []


@pytest.mark.parametrize("name", ["periodic", "one_step_off", "concurrent_engines"])
def test_read_in_one_pass_is_the_truth(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spills too large to hold are read in one pass (a second time too, with the job's step
    edges as fences): the same per-step figures."""
    monkeypatch.setattr(stream, "MAX_HELD_EVENTS", 0)
    job = _job(name, tmp_path)
    doc = json.loads(_summary(tmp_path, capsys, "--json"))
    assert doc["notes"] and all("summarised in one pass" in n for n in doc["notes"][:1])
    assert mismatches(doc, job.truth, held=False) == []


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _label(member: tuple[str, int]) -> str:
    role, rank = member
    return f"{role} rank {rank}" if role else f"rank {rank}"


def _step_lines(step: StepTruth) -> list[str]:
    """What the table says of ``step``: its critical path, what-if and rollout long tail."""
    links = []
    for link in step.path:
        text = f"{link.phase} {_ms(link.time)}"
        if link.waited is not None:
            text += f" (last: {_label(link.waited)} {link.waited_phase})"
        links.append(text)
    lines = ["  critical path: " + " > ".join(links)]
    w = step.what_if
    if w is not None:
        length = step.end - step.start
        lines.append(
            f"  if the slowest rank matched the median: {_ms(length - w.saving)} ms,"
            f" {_ms(w.saving)} less ({w.role} {w.phase}: rank {w.rank} {_ms(w.slowest)} vs"
            f" median {_ms(w.median)})"
        )
    t = step.tail
    if t is not None:
        n = len(t.engines)
        lines.append(
            f"  rollout long tail: {n} engine{'s' * (n != 1)}, slowest {_label(t.slowest)}"
            f" {_ms(t.slowest_ns)} ms vs median {_ms(t.median_ns)} ms"
            f" ({t.waiting_share * 100:.0f} % of the rollout waiting for it); decode steps "
            + "/".join(str(e.decode_steps) for e in t.engines)
        )
    return lines


@pytest.mark.parametrize("name", ["sync_grpo", "one_step_off", "recurring", "periodic", "edges"])
def test_the_table_says_the_truth(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The text table: each step's critical path, what-if and rollout tail; each role's
    steps (the job's) and every process's busy time in each step."""
    job = _job(name, tmp_path)
    text = _summary(tmp_path, capsys)
    lines = text.splitlines()
    for step in job.truth.steps:
        for want in _step_lines(step):
            assert any(line.startswith(want) for line in lines), (want, text)
    for p in job.truth.processes:
        head = f"== {p.role} == " if p.role else ""
        steps = f"rank {p.rank}: {p.steps} step{'s' * (p.steps != 1)}"
        assert any(line.startswith(head) and steps in line for line in lines), (steps, text)
        for i, busy in enumerate(p.busy):  # its row in the per-step table
            row = f" {p.role} {p.rank:>4} {_ms(busy):>10} {_ms(p.length[i] - busy):>10}  "
            assert row in text, (row, text)


#: The second host of the two-host job: its clock reads this far ahead, and it booted a week
#: before the first one.
AHEAD = 250 * MS
ANCHOR_B = ANCHOR - 7 * 86_400 * 10**9


def _two_hosts() -> Job:
    """Synchronous GRPO whose FSDP workers all run on a second host (the trainer and engines on
    the first, which runs none of the workers' phases). Each worker's call starts 1 ms after
    the trainer's and ends 9 to 20 ms before it: the slack is asymmetric, so the midpoint of the
    offset's bounds is not the truth."""
    return on_host(sync_grpo(), "oracle-b", AHEAD, ANCHOR_B, {"WorkerDict"})


def test_a_second_host_is_measured_within_its_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _two_hosts()
    write_spills(job, tmp_path)
    doc = json.loads(_summary(tmp_path, capsys, "--json"))
    clock = doc["per_step"]["clock"]
    b = next(m for m in clock["machines"] if m["hosts"] == ["oracle-b"])
    assert b["status"] == "measured", clock["accuracy"]
    assert 0 < abs(b["offset_ns"] - AHEAD) <= b["bound_ns"]  # (not exact: the slack is uneven)
    assert b["low_ns"] <= AHEAD <= b["high_ns"]
    assert clock["aligned_by"] == "measured"
    said = f"oracle-b {b['offset_ns'] / 1e6:.3f} ms ahead ±{b['bound_ns'] / 1e6:.3f} ms"
    assert said in clock["accuracy"] and "unchecked" in clock["accuracy"], clock["accuracy"]
    # every figure within what the output says the clock may be off; which worker a link
    # waited for is checked below (the path's links themselves, their times, here)
    wrong = mismatches(doc, job.truth, tol=b["bound_ns"])
    assert [x for x in wrong if "critical path:" not in x] == []


def test_a_second_host_names_whom_each_link_waited_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _two_hosts()
    write_spills(job, tmp_path)
    doc = json.loads(_summary(tmp_path, capsys, "--json"))
    bound = max(m["bound_ns"] or 0 for m in doc["per_step"]["clock"]["machines"])
    assert mismatches(doc, job.truth, tol=bound) == []
