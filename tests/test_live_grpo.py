"""Live step figures on the real verl 0.9.1 GRPO job (the session's marked run, shared with
tests/test_real_grpo.py: 2 steps) and its one-step-off job (shared with tests/test_real_async.py),
marked from the environment alone (``MSTX_MARKS_INSTRUMENT=verl,vllm``, ``MSTX_MARKS_OUT``),
with verl's ``console``, ``file`` and ``tensorboard`` loggers (tests/engines/verl_live.py). The
logged figures are read back from what each logger wrote and compared with ``mstx-marks summary
--json`` of the same run's files. The trainer's step time with and without them is a
measurement: benchmarks/live_step_time.py.

The file logger keeps each figure as logged (JSON, float64): equal to the summary's to the
microsecond. Tensorboard keeps a scalar as a float32 (torch's ``add_scalar``, which verl's
logger calls, writes ``simple_value``), coarser than a microsecond above 8 s (1.9 us at 20 s):
its figures equal the summary's within a microsecond plus one float32 step of the value.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.engine_run import clean_env
from support.grpo_job import Job, MarkedRun, cli, grpo_python
from support.live_figures import US, agree, figures_by_step, step_index

from mstx_marks.live.figures import step_figures

pytestmark = pytest.mark.engine

STEPS = [1, 2]
#: The roles of the job whose figures every step must have (Ray actor classes, vLLM's process).
ROLES = ("TaskRunner", "WorkerDict", "AgentLoopWorker", "EngineCore")
#: The one-step-off job's (tests/test_real_async.py): the sync's two sides have roles of their own.
ONE_STEP_OFF_ROLES = (
    "OneStepTaskRunner",
    "WorkerDict",
    "AgentLoopWorker",
    "EngineCore",
    "CheckpointEngineWorker",
    "vLLMHttpServer",
)


def _work(job: Job) -> Path:
    assert job.out is not None
    return job.out.parent / "work"


def _file_calls(job: Job) -> list[tuple[dict[str, Any], int]]:
    """What verl's file logger wrote: each log call's data and step."""
    path = _work(job) / "metrics.jsonl"
    assert path.is_file(), job.result
    return [(d["data"], int(d["step"])) for d in map(json.loads, path.read_text().splitlines())]


#: Read in the grpo venv: every scalar of verl's tensorboard event files, in the order written
#: (tensorboard's own reader of the files, the one its EventAccumulator uses).
_READ_EVENTS = """
import glob, json, os, sys
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
found = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], '**', '*tfevents*'), recursive=True)):
    for event in LegacyEventFileLoader(path).Load():
        for value in event.summary.value:
            if value.WhichOneof('value') == 'simple_value':
                found.append((path, event.step, value.tag, value.simple_value))
print(json.dumps(found))
"""


def _tensorboard_calls(job: Job) -> list[tuple[dict[str, Any], int]]:
    """What verl's tensorboard logger wrote, as its log calls: each call's data and step.

    The logger writes a call's keys one scalar event each, in order: a call ends where the step
    changes or a key comes again (two calls at one step: the last steps' figures at the end)."""
    events = _work(job) / "tensorboard"
    assert events.is_dir(), job.result
    done = subprocess.run(
        [str(grpo_python()), "-c", _READ_EVENTS, str(events)],
        env=clean_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls: list[tuple[dict[str, Any], int]] = []
    where: tuple[str, int] | None = None
    for path, step, tag, value in json.loads(done.stdout):
        if (path, step) != where or tag in calls[-1][0]:
            calls.append(({}, step))
            where = (path, step)
        calls[-1][0][tag] = value
    return calls


def _summary(job: Job) -> dict[str, Any]:
    """``mstx-marks summary --json``'s ``per_step`` of the job's files."""
    done = cli(grpo_python(), "summary", job.out, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["per_step"]  # type: ignore[no-any-return]


def _holds_every_figure(f: dict[str, float], roles: tuple[str, ...], rollout: bool = True) -> None:
    """One step's figures: each of ``roles`` busy and idle, the critical path, and the long tail
    where a rollout ran in the step (``rollout``), none where none did."""
    assert f["mstx/left_out"] == 0, f
    for role in roles:
        busy = [k for k in f if k.startswith(f"mstx/{role}") and k.endswith("/busy_s/max")]
        idle = [k for k in f if k.startswith(f"mstx/{role}") and "/idle_share/" in k]
        assert busy and idle, (role, sorted(f))
    if rollout:
        assert f["mstx/rollout/engines"] >= 1 and f["mstx/rollout/slowest_s"] > 0, sorted(f)
    else:
        assert not [k for k in f if k.startswith("mstx/rollout/")], sorted(f)
    assert f["mstx/critical_path/phases"] >= 1, sorted(f)
    assert any(k.startswith("mstx/critical_path/") and k.endswith("_s") for k in f)


def _float32_step(value: float) -> float:
    """The distance between two float32 numbers around ``value`` (float64's, 2**29 times finer)."""
    return math.ulp(value) * 2**29


def _agree_in_float32(tb: dict[str, float], per_step: dict[str, Any], key: str) -> None:
    """:func:`agree` for figures kept as float32: each within a microsecond and one float32 step
    of the summary's (the live figure within 1 us, then rounded to float32), the keys the same."""
    files = step_figures(per_step, step_index(per_step, key))
    off = {
        k: (v, files[k])
        for k, v in tb.items()
        if k in files and abs(v - files[k]) > US + _float32_step(files[k])
    }
    assert off == {}, key
    agree({k: files.get(k, v) for k, v in tb.items()}, per_step, key)  # (the keys: as logged)


def _tensorboard_holds_what_the_summary_says(
    job: Job, steps: list[int], roles: tuple[str, ...], rollouts: list[int]
) -> None:
    """Every step's figures in the tensorboard event files, logged in the same calls as the
    file logger's, each role's busy and idle, the critical path and the long tail (in the steps
    ``rollouts``) there, equal to ``summary --json`` of the job's files within float32."""
    figures = figures_by_step(_tensorboard_calls(job))
    assert sorted(figures) == steps, job.result["log"]
    in_file = figures_by_step(_file_calls(job))
    assert {s: at for s, (_, at, _) in figures.items()} == {
        s: at for s, (_, at, _) in in_file.items()
    }
    per_step = _summary(job)
    for step, (f, _, _) in figures.items():
        _holds_every_figure(f, roles, step in rollouts)
        _agree_in_float32(f, per_step, str(step))


@pytest.fixture(scope="module")
def per_step(live_on: Job) -> dict[str, Any]:
    return _summary(live_on)


def test_the_run_finishes_every_step(live_on: Job) -> None:
    assert live_on.result["rc"] == 0 and not live_on.result["timed_out"], live_on.result
    assert live_on.steps == STEPS, live_on.result["log"]


def test_every_step_has_each_roles_busy_idle_the_long_tail_and_the_critical_path(
    live_on: Job,
) -> None:
    figures = figures_by_step(_file_calls(live_on))
    assert sorted(figures) == STEPS, live_on.result["log"]
    for step, (f, logged_at, _) in figures.items():
        assert logged_at in (step, step + 1)  # at most one step late (the last: at finish)
        _holds_every_figure(f, ROLES)


def test_the_logged_figures_equal_the_summary_of_the_runs_files(
    live_on: Job, per_step: dict[str, Any]
) -> None:
    for step, (f, _, _) in figures_by_step(_file_calls(live_on)).items():
        agree(f, per_step, str(step))


def test_the_console_logger_prints_them_too(live_on: Job) -> None:
    """verl's console lines (``step:N - key:value - ...``): each step's figures in one line,
    the last step's in the line its logger's finish prints."""
    described = []
    for line in re.sub(r"\x1b\[[0-9;]*m", "", live_on.log).splitlines():
        found = re.search(r"(?:^|\s)step:(\d+) - .*?mstx/step:(\d+)(?: |$)", line)
        if found:
            described.append(int(found.group(2)))
            assert re.search(r"mstx/\S+/busy_s/max:", line), line[:300]
    assert described == STEPS, described


def test_tensorboard_holds_the_figures_equal_to_the_summary(live_on: Job) -> None:
    _tensorboard_holds_what_the_summary_says(live_on, STEPS, ROLES, STEPS)


# --- the one-step-off trainer: the rollout of step N+1 runs under step N ---------------------


@pytest.fixture(scope="module")
def live_on(grpo_marked: Job) -> Job:
    """The session's marked GRPO run (tests/support/grpo_runs.py): live figures are on there
    by default, beside the capture recipes."""
    return grpo_marked


@pytest.fixture(scope="module")
def one_step_off(one_step_off_marked: MarkedRun) -> Job:
    return one_step_off_marked.job


def test_one_step_off_logs_each_steps_figures_equal_to_the_summary(one_step_off: Job) -> None:
    job = one_step_off
    assert job.result["rc"] == 0 and not job.result["timed_out"], job.result
    figures = figures_by_step(_file_calls(job))
    assert sorted(figures) == [1, 2, 3], job.result["log"]
    per_step = _summary(job)
    for step, (f, logged_at, _) in figures.items():
        # Its steps 2 and 3 take under a second here (the rollout was made under the step
        # before), less than a step's figures take to settle: they come at the end of fit.
        assert logged_at >= step and f["mstx/left_out"] == 0, (step, logged_at)
        agree(f, per_step, str(step))
        # the weight sync, on both sides: the actor sends, the rollout receives
        assert f.get("mstx/weight_sync/actor_send_weights_s/max", 0) > 0, sorted(f)
        assert f.get("mstx/weight_sync/rollout_receive_weights_s/max", 0) > 0, sorted(f)


def test_one_step_off_tensorboard_holds_the_figures_equal_to_the_summary(
    one_step_off: Job,
) -> None:
    """Each step's rollout is made under the step before (the first under step 1 itself, while
    it waits), and the last step launches none (verl's ``_fit_generate``): no engine runs in
    the last step, which has no long tail."""
    steps = [1, 2, 3]
    _tensorboard_holds_what_the_summary_says(one_step_off, steps, ONE_STEP_OFF_ROLES, steps[:-1])
