"""The real verl GRPO job's runs, made once per test session and shared by the tests that read
them (tests/test_real_grpo.py, tests/test_real_grpo_recipes.py), made in the background
(background.py): each run takes minutes, so the marked run also carries the seed guide's capture
recipes, whose folders the recipes' tests read.

- ``grpo_plain``: no ``MSTX_MARKS_*`` variable anywhere;
- ``grpo_marked``: ``MSTX_MARKS_INSTRUMENT=verl,vllm``, ``MSTX_MARKS_OUT`` and
  ``MSTX_MARKS_CAPTURE`` (:data:`CAPTURE`) in the driver's environment, nothing else; its
  trainer logs to verl's ``console`` and ``file`` loggers (tests/engines/verl_live.py), which
  tests/test_live_grpo.py reads back the live figures from;
- ``one_step_off_marked``: the one-step-off trainer, marked as ``grpo_marked`` is (no capture),
  read by tests/test_real_async.py and tests/test_live_grpo.py.

``GRPO_TEST_DIR=<folder>`` runs the jobs there instead of pytest's temporary folders (kept
afterwards). A pytest plugin: tests/conftest.py names it in ``pytest_plugins``.
"""

from __future__ import annotations

import pytest

from . import background
from .grpo_job import INSTRUMENT, Job, MarkedRun, grpo_python, launch, marked_run, run_folder

JOB_TIMEOUT_S = 600  # about 190 s on an idle machine; 400 s seen with other jobs running
#: The seed guide's hand edits, as recipes (tests/test_real_grpo_recipes.py says what each holds).
CAPTURE = ";".join(
    (
        "update_micro_batch:wait=0,warmup=0,active=1",
        "ref_log_prob_micro_batch:wait=0,warmup=0,active=1",
        "rollout_decode:wait=1,warmup=0,active=2",
    )
)


@background.run(scope="session")
def grpo_plain(tmp_path_factory: pytest.TempPathFactory) -> background.Planned[Job]:
    return launch(grpo_python(), run_folder(tmp_path_factory, "grpo-plain"), None, JOB_TIMEOUT_S)


@background.run(scope="session")
def grpo_marked(tmp_path_factory: pytest.TempPathFactory) -> background.Planned[Job]:
    where = run_folder(tmp_path_factory, "grpo-marked")
    settings = {
        "MSTX_MARKS_INSTRUMENT": INSTRUMENT,
        "MSTX_MARKS_OUT": str(where / "out"),
        "MSTX_MARKS_CAPTURE": CAPTURE,
        "JOB": "grpo",
    }
    return launch(grpo_python(), where, settings, JOB_TIMEOUT_S, runner="verl_live.py")


@background.run(scope="session")
def one_step_off_marked(
    tmp_path_factory: pytest.TempPathFactory,
) -> background.Planned[MarkedRun]:
    return marked_run(
        tmp_path_factory, "one-step-off-marked", "verl_live.py", 900, {"JOB": "one_step_off"}
    )
