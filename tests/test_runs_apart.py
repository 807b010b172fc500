"""Runs of different ids in one folder are never summed, whenever they ran: two jobs writing
into one folder at the same time are two runs, the newest read, a note naming the other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mstx_marks.analysis.summary import format_table, load_traces, run_summary, summarize_path
from mstx_marks.base.records import RangeRecord, RankTrace
from mstx_marks.export import export_rank

T0 = 1_700_000_000_000_000_000
OLD, NEW = "20250101-000000-aaaaaa", "20250101-000001-bbbbbb"


def _job(run: str, pid: int, offset: int, steps: int = 20) -> RankTrace:
    """Rank 0 of one job: ``steps`` steps of 1 ms, each with a ``forward`` inside."""
    recs = []
    for i in range(steps):
        s = T0 + offset + i * 1_000_000
        recs.append(RangeRecord("step", "default", s, s + 900_000, 1, pid))
        recs.append(RangeRecord("forward", "default", s + 100, s + 500_000, 1, pid))
    return RankTrace(0, recs, run=run)


def _two_jobs_at_once(folder: Path, spread: int = 0) -> None:
    """Two jobs, rank 0 each, their steps interleaved in time (the second starts 0.3 ms after
    the first, while its first step runs), each written as the library writes a process whose
    rank others share: a Chrome trace named by process, and a database."""
    export_rank(folder, _job(OLD, pid=100, offset=0), process="host-100")
    export_rank(folder, _job(NEW, pid=200, offset=300_000 + spread), process="host-200")


def test_two_jobs_at_once_are_two_runs_and_the_newest_is_read(tmp_path: Path) -> None:
    _two_jobs_at_once(tmp_path)
    summary = summarize_path(tmp_path, jobs=1, progress=False)
    assert summary.errors == []
    (step,) = [p for p in summary.phases if p.name == "step"]
    assert step.overall.count == 20  # one job's steps, not both jobs' 40
    assert list(summary.step_count.values()) == [20]
    assert summary.run == NEW and summary.other_runs == [OLD]
    (note,) = [n for n in summary.notes if "runs are here" in n]
    assert NEW in note and OLD in note
    # the table says which run it shows, and that the other is there
    head = format_table(summary).splitlines()[0]
    assert NEW in head and OLD in head, head


def test_in_memory_the_same(tmp_path: Path) -> None:
    _two_jobs_at_once(tmp_path)
    traces, errors, notes = load_traces(tmp_path)
    assert errors == [] and [t.run for t in traces] == [NEW]
    assert sum(r.name == "step" for t in traces for r in t.records) == 20
    assert any(OLD in n for n in notes)


@pytest.mark.parametrize("which, count", [(OLD, 20), (NEW, 20), ("all", 40)])
def test_run_picks_one_or_every_run(tmp_path: Path, which: str, count: int) -> None:
    _two_jobs_at_once(tmp_path)
    summary = summarize_path(tmp_path, jobs=1, progress=False, run=which)
    (step,) = [p for p in summary.phases if p.name == "step"]
    assert step.overall.count == count
    assert not [n for n in summary.notes if "runs are here" in n]


def test_ranks_of_one_job_each_with_its_own_id_stay_one_run(tmp_path: Path) -> None:
    """Ranks started by a launcher that made no run id (a multi-node torchrun, each node its
    own) overlap in time as two jobs do, but no rank is in both: one job, summed."""
    a, b = _job(OLD, pid=100, offset=0), _job(NEW, pid=200, offset=300_000)
    b.rank = 1
    export_rank(tmp_path, a, process="host-100")
    export_rank(tmp_path, b, process="host-200")
    summary = summarize_path(tmp_path, jobs=1, progress=False)
    assert sorted(m.rank for m in summary.step_count) == [0, 1]
    assert not [n for n in summary.notes if "runs are here" in n]


def test_the_command_prints_one_runs_table_and_names_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _two_jobs_at_once(tmp_path)
    assert run_summary(str(tmp_path), "json") == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["run"] == NEW and data["other_runs"] == [OLD]
    (step,) = [p for p in data["phases"] if p["name"] == "step"]
    assert step["all"]["count"] == 20
    assert f"reading the newest, {NEW}" in err and OLD in err
