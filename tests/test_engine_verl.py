"""The real verl 0.9.1 classes (rl venv), instrumented from ``MSTX_MARKS_INSTRUMENT=verl``.

``tests/engines/verl_profiler.py`` imports verl (its ``verl.plugins`` entry point activates
mstx_marks) and ``verl.workers.engine_workers``, then runs the real ``ActorRolloutRefWorker``
stage methods under a real ``DistProfiler`` with tool ``npu``. torch_npu is a RECORDING
STAND-IN there (a fake package in ``sys.modules`` whose profiler objects and ``mstx`` calls
only log), so verl's real ``NPUProfiler.annotate`` runs; our ranges go to a mstx_marks backend
that logs to the same list: one logical clock across verl, the stand-in and mstx_marks.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.engine_run import clean_env, read_json, scenario, venv_python

TIMEOUT_S = 240
STAGES = {  # method: (our phase, the marker text verl 0.9.1 emits: its role)
    "compute_log_prob": ("compute_log_prob", "actor_compute_log_prob"),
    "compute_ref_log_prob": ("compute_ref_log_prob", "ref_compute_log_prob"),
    "update_actor": ("update_actor", "actor_update"),
}
BODY = {"compute_log_prob": "infer_batch", "update_actor": "train_mini_batch"}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = venv_python("rl")
    where = tmp_path_factory.mktemp("verl")
    result = where / "result.json"
    scenario(
        python, "verl_profiler.py", [where / "save", result],
        clean_env(MSTX_MARKS_INSTRUMENT="verl"), timeout=TIMEOUT_S, cwd=where,
    ).run()  # fmt: skip
    found: dict[str, Any] = read_json(result)
    return found


def test_import_verl_activates_through_its_plugin_entry_point(report: dict[str, Any]) -> None:
    assert report["mstx_marks_before_import_verl"] == []
    assert "mstx_marks.launch.plugins" in report["mstx_marks_after_import_verl"]
    assert report["activated_in"] == report["pid"]


def test_the_real_stage_methods_are_patched_at_import(report: dict[str, Any]) -> None:
    worker = "verl.workers.engine_workers:ActorRolloutRefWorker"
    assert {f"{worker}.{m}" for m in STAGES} <= set(report["patched"])
    assert "verl.workers.engine_workers:TrainingWorker.train_batch" in report["patched"]


@pytest.mark.parametrize("method", sorted(STAGES))
def test_the_class_attribute_is_verls_own_and_keeps_its_register_marker(
    report: dict[str, Any], method: str
) -> None:
    found = report["methods"][method]
    # The class attribute is still register's wrapper, from verl's own file: not ours.
    assert found["attr"]["qualname"] == "register.<locals>.decorator.<locals>.inner"
    assert found["attr"]["file"].endswith("verl/single_controller/base/decorator.py")
    assert found["register_marker"]  # attrs_3141562937: how the WorkerGroup finds the method
    # verl's decorator chain is untouched (functools.wraps links, down to the raw method)...
    chain = [layer["qualname"] for layer in found["chain"]]
    assert chain == [
        "register.<locals>.decorator.<locals>.inner",
        "tqbridge.<locals>.decorator.<locals>.inner",
        "DistProfiler.annotate.<locals>.decorator.<locals>.wrapper",
        "_with_routing_replay_flag.<locals>.decorator.<locals>.wrapper",
        f"ActorRolloutRefWorker.{method}",
    ]
    # ...and what changed is the closure cell DistProfiler.annotate's wrapper calls through.
    assert found["cell"]["file"].endswith("mstx_marks/capture/presets/verl.py")
    assert found["cell_wraps_original"]


@pytest.mark.parametrize("method", sorted(BODY))
def test_discrete_mode_our_range_is_inside_verls_profile_and_range(
    report: dict[str, Any], method: str
) -> None:
    ours, verls = STAGES[method]
    log = report["runs"][f"discrete/{method}"]
    (start,) = [e for e in log if e[:2] == ["verl", "range_start"]]
    rid = start[3]
    assert log == [
        ["profiler", "new", ["CPU", "NPU"]],  # verl's get_npu_profiler, inside the call
        ["profiler", "start"],
        ["verl", "range_start", verls, rid],
        ["ours", "range_start", ours, "default"],
        ["body", BODY[method]],
        ["ours", "range_end", ours, "default"],
        ["verl", "range_end", rid],
        ["profiler", "step"],
        ["profiler", "stop"],
    ]


def test_continuous_mode_no_duplicate_while_verl_marks_the_stage(report: dict[str, Any]) -> None:
    log = report["runs"]["continuous/active"]
    assert not [e for e in log if e[0] == "ours"]
    (start,) = [e for e in log if e[:2] == ["verl", "range_start"]]
    assert log == [
        ["profiler", "new", ["CPU", "NPU"]],
        ["profiler", "start"],
        ["verl", "range_start", "actor_compute_log_prob", start[3]],
        ["body", "infer_batch"],
        ["verl", "range_end", start[3]],
        ["profiler", "step"],
        ["profiler", "stop"],
    ]


def test_continuous_mode_ours_when_verls_profiler_is_not_running(report: dict[str, Any]) -> None:
    assert report["runs"]["continuous/inactive"] == [
        ["ours", "range_start", "compute_log_prob", "default"],
        ["body", "infer_batch"],
        ["ours", "range_end", "compute_log_prob", "default"],
    ]
