"""``mstx-marks diff``: two runs side by side per role and phase, with a noise band from the
steps' own spread, and a gate for CI (analysis/diff.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mstx_marks.analysis.diff import DiffRow
from mstx_marks.base.records import RangeRecord, RankTrace
from mstx_marks.cli.main import main
from mstx_marks.export import write_chrome_trace

MS = 10**6
T0 = 1_750_000_000_000_000_000


def write_run(
    folder: Path, update_ms: list[float], run: str = "r1", gen_ms: float = 80, t0: int = T0
) -> Path:
    """A run of ``len(update_ms)`` steps: the trainer's ``gen`` then ``update_actor``, which
    two FSDP workers run too (rank 1 a little longer), one Chrome trace per process."""
    folder.mkdir(parents=True, exist_ok=True)
    trainer, workers = [], {0: [], 1: []}
    t = t0
    for update in update_ms:
        gen, upd = int(gen_ms * MS), int(update * MS)
        trainer.append(RangeRecord("step", "default", t, t + gen + upd + MS, 1, 10))
        trainer.append(RangeRecord("gen", "default", t, t + gen, 1, 10))
        trainer.append(RangeRecord("update_actor", "default", t + gen, t + gen + upd, 1, 10))
        for rank, rec in workers.items():
            end = t + gen + upd - (MS if rank == 0 else 0)
            rec.append(RangeRecord("update_actor", "default", t + gen, end, 1, 20 + rank))
        t += gen + upd + 2 * MS
    write_chrome_trace(
        folder / f"trainer-{run}.trace.json", [RankTrace(0, trainer, role="TaskRunner", run=run)]
    )
    for rank, rec in workers.items():
        trace = RankTrace(rank, rec, role="WorkerDict", run=run)
        write_chrome_trace(folder / f"worker{rank}-{run}.trace.json", [trace])
    return folder


BASE = [100, 102, 98, 101, 99]
SLOWER = [130, 131, 129, 132, 130]


def test_the_noise_band_is_the_runs_spreads_combined() -> None:
    row = DiffRow("r", "p", [10, 12, 8, 11], [20, 21, 19, 22])
    # MADs 1 and 1: 1.4826 * sqrt(2)
    assert row.noise_ns == pytest.approx(1.4826 * 2**0.5)
    assert (row.base_ns, row.new_ns, row.change_ns, row.verdict) == (10.5, 20.5, 10.0, "slower")
    assert row.beyond_pct() == pytest.approx(100 * (10 - row.noise_ns) / 10.5)
    assert row.over(50) and not row.over(80)
    noisy = DiffRow("r", "p", [100, 60, 140, 100], [104, 64, 144, 104])
    assert noisy.verdict == "within noise" and not noisy.over(0)
    assert DiffRow("r", "p", [], [5]).verdict == "new" and not DiffRow("r", "p", [], [5]).over(0)
    assert DiffRow("r", "p", [5], []).verdict == "gone"
    faster = DiffRow("r", "p", [100, 100], [50, 50])
    assert faster.verdict == "faster" and not faster.over(0)  # a speed-up never fails the gate


def test_two_folders_largest_change_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = write_run(tmp_path / "a", BASE), write_run(tmp_path / "b", SLOWER)
    assert main(["diff", str(a), str(b), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["rows"]
    assert [abs(r["change_ns"]) for r in rows] == sorted(
        (abs(r["change_ns"]) for r in rows), reverse=True
    )
    update = next(r for r in rows if (r["role"], r["phase"]) == ("WorkerDict", "update_actor"))
    assert update["base_ns"] == 100 * MS and update["new_ns"] == 130 * MS  # the slowest rank's
    assert update["verdict"] == "slower" and update["base_steps"] == update["new_steps"] == 5
    step = next(r for r in rows if r["phase"] == "(step)")
    assert step["change_ns"] == 30 * MS
    gen = next(r for r in rows if (r["role"], r["phase"]) == ("TaskRunner", "generate_sequences"))
    assert gen["change_ns"] == 0 and gen["verdict"] == "within noise"


@pytest.mark.parametrize(("threshold", "status"), [("5", 1), ("50", 0)])
def test_the_threshold_gates_a_slowdown_beyond_noise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], threshold: str, status: int
) -> None:
    a, b = write_run(tmp_path / "a", BASE), write_run(tmp_path / "b", SLOWER)
    assert main(["diff", str(a), str(b), "--threshold", threshold]) == status
    out = capsys.readouterr().out
    if status:
        assert "WorkerDict update_actor" in out.splitlines()[-1] and "(over 5%)" in out
    else:
        assert out.splitlines()[-1].startswith("0 row(s) grew by more than")
    assert main(["diff", str(b), str(a), "--threshold", "5"]) == 0  # faster: never gated


def test_a_change_within_the_steps_own_spread_is_noise(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", [100, 140, 60, 100, 120])
    b = write_run(tmp_path / "b", [104, 144, 64, 104, 124])
    assert main(["diff", str(a), str(b), "--threshold", "1"]) == 0


def test_two_runs_of_one_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path, BASE, run="r1")
    write_run(tmp_path, SLOWER, run="r2", t0=T0 + 10**12)
    assert main(["diff", str(tmp_path), "--base-run", "r1", "--new-run", "r2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "(run r1)" in doc["base"] and "(run r2)" in doc["new"]
    step = next(r for r in doc["rows"] if r["phase"] == "(step)")
    assert step["change_ns"] == 30 * MS
    assert main(["diff", str(tmp_path)]) == 2  # the folder against itself
    assert "name two folders, or two runs" in capsys.readouterr().err


def test_nothing_to_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path / "a", BASE)
    bare = tmp_path / "b"
    bare.mkdir()
    trace = RankTrace(0, [RangeRecord("gen", "default", T0, T0 + MS, 1, 1)], role="x")
    write_chrome_trace(bare / "x.trace.json", [trace])  # no steps
    assert main(["diff", str(a), str(bare)]) == 2
    assert "no process with steps: nothing to compare" in capsys.readouterr().err
    assert main(["diff", str(a), str(tmp_path / "missing")]) == 2


def test_a_file_that_cannot_be_read_fails_the_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = write_run(tmp_path / "a", BASE), write_run(tmp_path / "b", BASE)
    (b / "broken.trace.json").write_text("{not json")
    assert main(["diff", str(a), str(b)]) == 1
    assert "broken.trace.json" in capsys.readouterr().err


def test_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = write_run(tmp_path / "a", BASE), write_run(tmp_path / "b", SLOWER)
    main(["diff", str(a), str(b), "--threshold", "5"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"base {a}: 5 steps of TaskRunner rank 0")
    head = next(i for i, line in enumerate(lines) if line.startswith("role"))
    first = lines[head + 1].split()
    assert first[:2] == ["-", "(step)"] or "update_actor" in first or "(busy)" in first
    assert any("slower (over 5%)" in line for line in lines)
