"""Live step figures (mstx_marks/live, export/spill_tail.py, export/live_beat.py): a spill's
window read back as the whole file reads, and a job of real processes (tests/support/
live_job.py: a trainer logging each step as verl's ``Tracking.log`` does, two rollout workers)
whose logged figures equal ``mstx-marks summary --json`` of its files, and whose worker killed
mid-step costs that step its figures, not the trainer a wait."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.live_figures import US, agree, figures_by_step, step_index
from support.oracle import SHAPES, write_spills

from mstx_marks.backends.record import Recorder
from mstx_marks.cli.main import main
from mstx_marks.export.spill import Spill, read_spill
from mstx_marks.export.spill_tail import SpillWindow
from mstx_marks.live.figures import step_figures

JOB = Path(__file__).resolve().parent / "support" / "live_job.py"

# --- a step's critical path as keys: every link, a phase on it twice included --------------


def test_a_phase_twice_on_the_critical_path_keeps_both_links(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The oracle's recurring shape (update_weights > gen > update_actor > update_weights):
    each link its own keys, and the phase's time the sum of its links, as ``summary --json``
    says them."""
    job = SHAPES["recurring"]()
    write_spills(job, tmp_path)
    capsys.readouterr()
    assert main(["summary", "--json", "--jobs", "1", str(tmp_path)]) == 0
    per_step = json.loads(capsys.readouterr().out)["per_step"]
    for i, truth in enumerate(job.truth.steps):
        f = step_figures(per_step, i)
        assert f["mstx/critical_path/phases"] == len(truth.path)
        phases = [link.phase for link in truth.path]
        assert len(set(phases)) < len(phases)  # (a phase recurs)
        for phase in set(phases):
            want = sum(link.time for link in truth.path if link.phase == phase) / 1e9
            assert abs(f[f"mstx/critical_path/{phase}_s"] - want) <= US
        for k, link in enumerate(truth.path, 1):
            assert abs(f[f"mstx/critical_path/{k:02d}/{link.phase}_s"] - link.time / 1e9) <= US
            assert link.waited is not None
            role, rank = link.waited
            assert f[f"mstx/critical_path/{k:02d}/{link.phase}/waited/{role}"] == rank
        links = [k for k in f if k.startswith("mstx/critical_path/") and k.count("/") == 3]
        assert len(links) == len(truth.path)  # (one time key a link, none left over)


# --- a spill's window: what the summary reads of it, less what was forgotten ------------------


def _key(r: Any) -> tuple[str, int, int]:
    return r.name, r.start_ns, getattr(r, "end_ns", r.start_ns)  # (an instant: its time)


@settings(max_examples=25, deadline=None)
@given(
    writes=st.lists(
        st.lists(st.sampled_from(["a", "b", "decode_batch", "tick"]), max_size=12),
        min_size=1, max_size=6,
    ),
    forget_at=st.integers(0, 6),
)  # fmt: skip
def test_a_window_reads_back_as_its_spill_from_where_it_forgot(
    tmp_path_factory: pytest.TempPathFactory, writes: list[list[str]], forget_at: int
) -> None:
    folder = tmp_path_factory.mktemp("spill")
    rec = Recorder(capacity=10_000)
    spill = Spill(folder, rec, rank=3, role="rollout", run="r1")
    window = SpillWindow(spill.path)
    horizon = 0
    rec.range_end(rec.range_start("first", "d"), "d")  # (a spill is made for events only)
    for n, names in enumerate(writes):
        for name in names:
            if name == "tick":
                rec.instant(name, "d")
            else:
                rec.range_end(rec.range_start(name, "d"), "d")
        spill.write_now()
        window.follow()
        if n == forget_at:
            horizon = max((_key(r)[2] for r in read_spill(spill.path).records), default=0)
            window.forget_before(horizon)
    whole = read_spill(spill.path)
    copy = read_spill(window.write(tmp_path_factory.mktemp("window")))
    every, kept = {_key(r) for r in whole.records}, {_key(r) for r in copy.records}
    assert kept <= every
    assert {e for e in every if e[2] >= horizon} <= kept
    if forget_at >= len(writes):  # nothing forgotten: the same trace
        assert copy.records == whole.records
    for field in ("rank", "role", "run", "instance", "host", "anchor_ns", "complete", "dropped"):
        assert getattr(copy, field) == getattr(whole, field), field


def test_a_window_follows_only_whole_lines_and_a_file_made_again(tmp_path: Path) -> None:
    rec = Recorder()
    spill = Spill(tmp_path, rec, rank=0, role="trainer")
    rec.range_end(rec.range_start("step", "d"), "d")
    path = spill.write_now()
    data = path.read_bytes()
    half = tmp_path / "half.jsonl"
    half.write_bytes(data[: len(data) - 5])  # its last line cut in the middle
    window = SpillWindow(half)
    window.follow()
    assert read_spill(window.write(tmp_path / "a")).records == []
    with open(half, "ab") as f:
        f.write(data[len(data) - 5 :])
    window.follow()
    assert [r.name for r in read_spill(window.write(tmp_path / "b")).records] == ["step"]
    half.unlink()
    half.write_bytes(data)  # made again (a folder removed and made): read from its start
    window.follow()
    assert [r.name for r in read_spill(window.write(tmp_path / "c")).records] == ["step"]


# --- a job of real processes ----------------------------------------------------------------


def _run_job(where: Path, steps: int, kill_step: int) -> dict[str, Any]:
    out = where / "out"
    result = where / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    env.update(MSTX_MARKS_OUT=str(out), MSTX_MARKS_ROLE="trainer", RANK="0")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent)])
    done = subprocess.run(
        [sys.executable, str(JOB), "trainer", str(result), str(steps), str(kill_step)],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(result.read_text())
    report["stderr"] = done.stderr
    summary = subprocess.run(
        [sys.executable, "-m", "mstx_marks", "summary", str(out), "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert summary.returncode == 0, summary.stderr
    report["per_step"] = json.loads(summary.stdout)["per_step"]
    return report


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run_job(tmp_path_factory.mktemp("live"), steps=3, kill_step=0)


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run_job(tmp_path_factory.mktemp("killed"), steps=4, kill_step=2)


def test_every_step_is_logged_once_at_most_one_step_late(job: dict[str, Any]) -> None:
    figures = figures_by_step(job["calls"])
    assert sorted(figures) == [1, 2, 3], job["stderr"]
    for step, (f, logged_at, _) in figures.items():
        assert logged_at in (step, step + 1), (step, logged_at)  # the last one: at finish
        assert f["mstx/left_out"] == 0
    assert figures[3][1] == 3  # the last step's, at the logger's finish


def test_logged_figures_equal_the_summary_of_the_files(job: dict[str, Any]) -> None:
    per_step = job["per_step"]
    for step, (live, _, _) in figures_by_step(job["calls"]).items():
        i = step_index(per_step, str(step))
        agree(live, per_step, str(step))
        # and read from the summary's own lists, not through step_figures
        rows = [p for p in per_step["processes"] if p["role"] == "rollout"]
        assert abs(live["mstx/rollout/busy_s/max"] - max(p["busy_ns"][i] for p in rows) / 1e9) <= US
        shares = [p["idle_ns"][i] / p["length_ns"][i] for p in rows]
        assert abs(live["mstx/rollout/idle_share/max"] - max(shares)) <= US
        path = per_step["steps"][i]["critical_path"]
        assert live["mstx/critical_path/phases"] == len(path) > 0
        for link in path:
            assert abs(live[f"mstx/critical_path/{link['phase']}_s"] - link["time_ns"] / 1e9) <= US
        tail = per_step["steps"][i]["rollout_tail"]
        assert live["mstx/rollout/engines"] == len(tail["engines"]) == 2
        assert live["mstx/rollout/slowest/rollout"] == tail["slowest"]["rank"] == 1
        assert abs(live["mstx/rollout/slowest_s"] - tail["slowest_ns"] / 1e9) <= US


def test_a_worker_killed_mid_step_costs_that_step_its_figures(killed: dict[str, Any]) -> None:
    figures = figures_by_step(killed["calls"])
    assert sorted(figures) == [1, 2, 3, 4], killed["stderr"]
    per_step = killed["per_step"]
    first, second = figures[1][0], figures[2][0]
    assert first["mstx/rollout/ranks"] == 2 and first["mstx/left_out"] == 0
    agree(first, per_step, "1")
    # step 2: the killed worker is left out, said, and the figures still came one step late
    assert second["mstx/left_out"] == 1 and second["mstx/rollout/ranks"] == 1
    assert figures[2][1] == 3
    assert "step 2's live figures leave out rollout rank 0" in killed["stderr"]
    # the trainer's own figures that step are the files' all the same
    files = step_figures(per_step, step_index(per_step, "2"))
    for key in [k for k in files if k.startswith("mstx/trainer/")]:
        assert abs(second[key] - files[key]) <= US, key
    # later steps: silent since before them, it had nothing in them, and stays as the files
    # show it (idle): the figures are the files' again
    for step in (3, 4):
        assert figures[step][0]["mstx/left_out"] == 0
        agree(figures[step][0], per_step, str(step))


# --- the verl preset: Tracking.log and finish go through the slot that live fills -----------


def test_the_verl_preset_gives_trackings_calls_the_figures_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from support.stand_ins import fake_module

    from mstx_marks.capture import live_slot, presets
    from mstx_marks.live import arm, disarm
    from mstx_marks.live.steps import LiveSteps

    class Tracking:  # verl/utils/tracking.py's shape: log(data, step, backend=None), finish()
        def __init__(self) -> None:
            self.logged: list[tuple[dict[str, Any], int]] = []
            self._finished = False

        def log(self, data: dict[str, Any], step: int, backend: Any = None) -> None:
            self.logged.append((dict(data), step))

        def finish(self) -> None:
            self._finished = True

    fake_module(monkeypatch, "verl.utils.tracking", Tracking=Tracking)
    monkeypatch.setenv("MSTX_MARKS_LIVE", "0")
    assert not arm(tmp_path / "out")  # turned off: the slot stays empty
    monkeypatch.delenv("MSTX_MARKS_LIVE")
    assert arm(tmp_path / "out")
    live_slot.fill(lambda: LiveSteps(tmp_path / "out", finish_s=0.3))  # (not 10 s: a test)
    try:
        with presets.apply("verl"):
            t = Tracking()
            t.log({"val/score": 1.0}, 0)
            t.log({"timing_s/step": 1.0}, 1)
            t.log({"x": 1.0}, 1, backend=["console"])  # some backends only: left as it is
            with pytest.warns(match=r"no live figures for step\(s\) \[1\]"):
                t.finish()  # (no spill under out/: none could be made, and that is said)
            t.finish()  # (verl's __del__ calls it again: nothing more)
    finally:
        disarm()
    assert [step for _, step in t.logged] == [0, 1, 1]
    assert "mstx/live/hold_ms" in t.logged[1][0] and "mstx/live/hold_ms" not in t.logged[2][0]
    assert (tmp_path / "out" / "live").is_dir()  # what makes every process beat


def test_a_trainer_that_never_closes_its_logger_logs_the_last_figures_when_fit_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """verl's one-step-off and fully async trainers keep their ``Tracking`` open until Ray kills
    the actor: the last step's figures go at the end of ``fit`` (an ``async def`` there)."""
    import asyncio

    from support.stand_ins import fake_module

    from mstx_marks.capture import live_slot, presets

    class Tracking:
        def __init__(self) -> None:
            self.logged: list[tuple[dict[str, Any], int]] = []

        def log(self, data: dict[str, Any], step: int, backend: Any = None) -> None:
            self.logged.append((dict(data), step))

    class Figures:  # a StepLogger whose last step's figures wait for the end
        def log(self, data: dict[str, Any], step: int) -> list[tuple[dict[str, Any], int]]:
            return [(data, step)]

        def finish(self) -> list[tuple[dict[str, Any], int]]:
            return [({"mstx/step": 3}, 3)]

    class RayPPOTrainer:
        def fit(self) -> None: ...

    class OneStepOffRayTrainer(RayPPOTrainer):
        async def fit(self) -> None:  # type: ignore[override]
            self.logger.log({"timing_s/step": 1.0}, 3)

    fake_module(monkeypatch, "verl.utils.tracking", Tracking=Tracking)
    fake_module(monkeypatch, "verl.trainer.ppo.ray_trainer", RayPPOTrainer=RayPPOTrainer)
    live_slot.fill(Figures)
    try:
        with presets.apply("verl"):
            trainer = OneStepOffRayTrainer()
            trainer.logger = Tracking()
            asyncio.run(trainer.fit())
            trainer.logger.log({"after": 1.0}, 4)  # the logger stays open, its calls its own
    finally:
        live_slot.empty()
    assert trainer.logger.logged == [
        ({"timing_s/step": 1.0}, 3),
        ({"mstx/step": 3}, 3),
        ({"after": 1.0}, 4),
    ]
