"""Live step figures on the real verl 0.9.1 GRPO job (the session's marked run, shared with
tests/test_real_grpo.py: 2 steps) and its one-step-off job (shared with tests/test_real_async.py),
marked from the environment alone (``MSTX_MARKS_INSTRUMENT=verl,vllm``, ``MSTX_MARKS_OUT``),
with verl's ``console`` and ``file`` loggers, and ``tensorboard`` when the grpo venv can import
it (tests/engines/verl_live.py). The logged figures are read back from what each logger wrote
and compared with ``mstx-marks summary --json`` of the same run's files. The trainer's step time
with and without them is a measurement: benchmarks/live_step_time.py.

The grpo venv has no ``tensorboard`` package today (verl's ``tensorboard`` logger needs it for
``torch.utils.tensorboard``): the event files are read back only where it has; the file logger
(JSON lines, float64) is what proves the figures equal the files' to the microsecond.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.engine_run import clean_env
from support.grpo_job import Job, MarkedRun, cli, grpo_python
from support.live_figures import agree, figures_by_step

pytestmark = pytest.mark.engine

STEPS = [1, 2]
#: The roles of the job whose figures every step must have (Ray actor classes, vLLM's process).
ROLES = ("TaskRunner", "WorkerDict", "AgentLoopWorker", "EngineCore")


def _work(job: Job) -> Path:
    assert job.out is not None
    return job.out.parent / "work"


def _file_calls(job: Job) -> list[tuple[dict[str, Any], int]]:
    """What verl's file logger wrote: each log call's data and step."""
    path = _work(job) / "metrics.jsonl"
    assert path.is_file(), job.result
    return [(d["data"], int(d["step"])) for d in map(json.loads, path.read_text().splitlines())]


@pytest.fixture(scope="module")
def per_step(live_on: Job) -> dict[str, Any]:
    done = cli(grpo_python(), "summary", live_on.out, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["per_step"]  # type: ignore[no-any-return]


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
        assert f["mstx/left_out"] == 0, f
        for role in ROLES:
            busy = [k for k in f if k.startswith(f"mstx/{role}") and k.endswith("/busy_s/max")]
            idle = [k for k in f if k.startswith(f"mstx/{role}") and "/idle_share/" in k]
            assert busy and idle, (role, sorted(f))
        assert f["mstx/rollout/engines"] >= 1 and f["mstx/rollout/slowest_s"] > 0, sorted(f)
        assert f["mstx/critical_path/phases"] >= 1, sorted(f)
        assert any(k.startswith("mstx/critical_path/") and k.endswith("_s") for k in f)


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


def test_tensorboard_holds_the_figures_where_the_venv_has_it(live_on: Job) -> None:
    """Each ``mstx/`` scalar in the event files is the float32 of the figure the file logger
    got in the same call (which the test above holds equal to the summary's)."""
    events = _work(live_on) / "tensorboard"
    if not events.is_dir():
        pytest.skip("the grpo venv has no tensorboard package: verl's file logger read instead")
    code = (
        "import json, sys\n"
        "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
        "acc = EventAccumulator(sys.argv[1], size_guidance={'scalars': 0}); acc.Reload()\n"
        "print(json.dumps({t: [(e.step, e.value) for e in acc.Scalars(t)]"
        " for t in acc.Tags()['scalars'] if t.startswith('mstx/')}))\n"
    )
    done = subprocess.run(
        [str(grpo_python()), "-c", code, str(events)],
        env=clean_env(), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    import numpy as np

    scalars = json.loads(done.stdout)
    logged = [(d, s) for d, s in _file_calls(live_on) if "mstx/step" in d]
    assert logged and scalars
    for data, step in logged:
        for key, value in data.items():
            if key.startswith("mstx/") and key != "mstx/live/hold_ms":
                points = [v for s, v in scalars.get(key, []) if s == step]
                assert np.float32(value) in [np.float32(v) for v in points], (key, step)


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
    done = cli(grpo_python(), "summary", job.out, "--json")
    assert done.returncode == 0, done.stderr
    per_step = json.loads(done.stdout)["per_step"]
    for step, (f, logged_at, _) in figures.items():
        # Its steps 2 and 3 take under a second here (the rollout was made under the step
        # before), less than a step's figures take to settle: they come at the end of fit.
        assert logged_at >= step and f["mstx/left_out"] == 0, (step, logged_at)
        agree(f, per_step, str(step))
        # the weight sync, on both sides: the actor sends, the rollout receives
        assert f.get("mstx/weight_sync/actor_send_weights_s/max", 0) > 0, sorted(f)
        assert f.get("mstx/weight_sync/rollout_receive_weights_s/max", 0) > 0, sorted(f)
