"""``mstx-marks diff``: two runs side by side per role and phase, with a noise band from the
steps' own spread, and a gate for CI (analysis/diff.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    row = DiffRow("r", "p", [10, 12, 8, 11, 10], [20, 21, 19, 22, 20])
    # MADs 1 and 1: 1.4826 * sqrt(2)
    assert row.noise_ns == pytest.approx(1.4826 * 2**0.5)
    assert (row.base_ns, row.new_ns, row.change_ns, row.verdict) == (10, 20, 10.0, "slower")
    assert row.beyond_pct() == pytest.approx(100 * (10 - row.noise_ns) / 10)
    assert row.over(50) and not row.over(80)
    noisy = DiffRow("r", "p", [100, 60, 140, 90, 120], [104, 64, 144, 94, 124])
    assert noisy.verdict == "within noise" and not noisy.over(0)
    assert DiffRow("r", "p", [], [5]).verdict == "new" and not DiffRow("r", "p", [], [5]).over(0)
    assert DiffRow("r", "p", [5], []).verdict == "gone"
    faster = DiffRow("r", "p", [100] * 5, [50] * 5)
    assert faster.verdict == "faster" and not faster.over(0)  # a speed-up never fails the gate
    few = DiffRow("r", "p", [100] * 4, [200] * 5)  # a band of 0 from 4 steps: not judged
    assert few.verdict == "too few steps" and not few.over(0)


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
    # as --help says: the folder alone is its two newest runs, the older the base
    assert main(["diff", "--help"]) == 0
    assert "its two newest, the older as the base" in " ".join(capsys.readouterr().out.split())
    assert main(["diff", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == doc
    # one run named: the other is the newest; the newest against itself is refused
    assert main(["diff", str(tmp_path), "--base-run", "r1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == doc
    assert main(["diff", str(tmp_path), "--base-run", "r2"]) == 2
    assert "run r2 against itself" in capsys.readouterr().err
    assert main(["diff", str(tmp_path), "--base-run", "r1", "--new-run", "r1"]) == 2
    assert "against itself: name two folders, or two runs" in capsys.readouterr().err


def test_a_folder_of_one_run_alone_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path, BASE, run="r1")
    assert main(["diff", str(tmp_path)]) == 2
    assert "holds one run: name a second folder" in capsys.readouterr().err


def test_one_folder_named_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a = write_run(tmp_path / "a", BASE)
    (tmp_path / "link").symlink_to(a)
    monkeypatch.chdir(tmp_path)
    for again in [f"{a}/", "./a", "a", str(tmp_path / "link"), "link/"]:
        assert main(["diff", str(a), again, "--json"]) == 2, again
        captured = capsys.readouterr()
        assert "are one folder" in captured.err and not captured.out
    assert main(["diff", str(a), str(a)]) == 2
    assert "against itself" in capsys.readouterr().err


def _phase_every_other_step(folder: Path, validation_ms: int, run: str = "r1") -> Path:
    """Ten steps of the trainer: update_actor 100 ms every step, validation every other step
    (``validation_ms``)."""
    folder.mkdir(parents=True, exist_ok=True)
    recs, t = [], T0
    for k in range(10):
        length = 100 * MS + (validation_ms * MS if k % 2 else 0)
        recs.append(RangeRecord("step", "default", t, t + length + MS, 1, 10))
        recs.append(RangeRecord("update_actor", "default", t, t + 100 * MS, 1, 10))
        if k % 2:
            recs.append(RangeRecord("validation", "default", t + 100 * MS, t + length, 1, 10))
        t += length + 2 * MS
    write_chrome_trace(folder / "t.trace.json", [RankTrace(0, recs, role="TaskRunner", run=run)])
    return folder


def test_a_phase_of_every_other_step_is_compared_where_it_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _phase_every_other_step(tmp_path / "a", 100)
    b = _phase_every_other_step(tmp_path / "b", 200)
    assert main(["diff", str(a), str(b), "--json", "--threshold", "5"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (row,) = [r for r in doc["rows"] if r["phase"] == "validation"]
    assert (row["base_ns"], row["new_ns"]) == (100 * MS, 200 * MS)
    assert (row["base_steps"], row["new_steps"], row["verdict"]) == (5, 5, "slower")
    assert [r["phase"] for r in doc["over"]] == ["validation"]


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "-1", "1e400", "five"])
def test_a_threshold_that_is_no_percentage_is_refused_before_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    a, b = write_run(tmp_path / "a", BASE), write_run(tmp_path / "b", SLOWER)
    assert main(["diff", str(a), str(b), "--json", f"--threshold={value}"]) == 2
    captured = capsys.readouterr()
    assert not captured.out and "argument --threshold" in captured.err
    assert "finite number of percent, 0 or more" in captured.err or "not a number" in captured.err


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 10**9), max_size=8),
    st.lists(st.integers(0, 10**9), max_size=8),
    st.floats(0, 1e6, allow_nan=False, allow_infinity=False),
)
def test_a_rows_json_is_always_json(base: list[int], new: list[int], pct: float) -> None:
    row = DiffRow("r", "p", base, new)
    text = json.dumps(row.to_json(), allow_nan=False)  # raises on a NaN or an infinity
    assert json.loads(text)["verdict"] == row.verdict
    assert not row.over(pct) or (row.judged and row.change_ns > 0)


def test_rows_of_a_few_steps_are_not_judged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three steps alike but for one: their spread is 0, so any change would look real."""
    a = write_run(tmp_path / "a", [100, 100, 101])
    b = write_run(tmp_path / "b", [100.7, 100.7, 101.7])
    assert main(["diff", str(a), str(b), "--threshold", "0"]) == 0
    out = capsys.readouterr().out
    assert "fewer than 5 such steps in a run is not judged" in " ".join(out.split())
    update = next(line for line in out.splitlines() if "WorkerDict" in line and "update" in line)
    assert update.endswith("too few steps")
    assert "3 steps of TaskRunner rank 0 (3 in all), 3 processes" in out
    assert main(["diff", str(a), str(b), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["min_steps"] == 5 and {r["verdict"] for r in doc["rows"]} == {"too few steps"}
    assert not any(r["judged"] for r in doc["rows"])


def test_one_process_is_one_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _phase_every_other_step(tmp_path / "a", 100)
    b = _phase_every_other_step(tmp_path / "b", 100)
    assert main(["diff", str(a), str(b)]) == 0
    assert "10 steps of TaskRunner rank 0 (10 in all), 1 process\n" in capsys.readouterr().out


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
