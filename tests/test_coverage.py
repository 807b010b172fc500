"""``mstx-marks coverage``: the expected phases a run never emitted, and the hot-path classes it
ran unmarked, per process; exit 1 if any."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from support.recorded import rng

import mstx_marks
from mstx_marks.analysis.model import stages
from mstx_marks.analysis.model.coverage import EXPECTATIONS, check_coverage, expected_phases
from mstx_marks.analysis.readers import chrome_json, find_trace_files, part_of_file, stream
from mstx_marks.analysis.summary import format_json, load_traces, summarize, summarize_path
from mstx_marks.base.records import InstantRecord, RankTrace
from mstx_marks.capture.presets import built
from mstx_marks.cli.main import main
from mstx_marks.export import export_rank


def _write(tmp_path: Path, rank: int, names: list[str], role: str = "") -> None:
    recs = [rng(n, 10 * i, 10 * i + 5) for i, n in enumerate(names)]
    export_rank(tmp_path, RankTrace(rank, recs, role=role))


def test_a_dropped_range_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # verl 0.9.1 names: actor_update / actor_compute_log_prob fold into the canonical phases.
    names = ["step", "gen", "compute_score", "actor_compute_log_prob", "adv", "actor_update"]
    _write(tmp_path, 0, names)
    _write(tmp_path, 1, ["step", "gen", "compute_score", "old_log_prob", "adv", "update_actor"])
    assert main(["coverage", str(tmp_path), "--expect", "verl-grpo"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "MISSING in every process: compute_ref_log_prob"
    assert out[0].startswith("rank 0: 6/7 expected phases")


def test_all_present_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, 0, list(EXPECTATIONS["vllm"]))
    assert main(["coverage", str(tmp_path), "--expect", "vllm"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("ok: every one of the 3")


def test_expectations_mix_and_fold() -> None:
    assert expected_phases("vllm+update,gen") == [
        "vllm_one_step",
        "prefill_batch",
        "decode_batch",
        "update_actor",
        "generate_sequences",
    ]
    report = check_coverage([], ["step"])
    assert report.missing == ["step"] and report.by_process == {}


def test_no_traces_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["coverage", str(tmp_path / "none"), "--expect", "verl-grpo"]) == 2
    assert "no such file or folder" in capsys.readouterr().err


# A process that built a hot-path class no preset wraps: recorded by the real producer
# (capture/presets/built.py), written as our files, read back.

WORKER_MODULE = "vllm_ascend.worker.worker_v1"
SAID = "NPUWorker.execute_model ran unmarked in EngineCore rank 0"


class _Engine:
    """Where a framework builds its worker (vLLM's ``WorkerWrapperBase.init_worker``)."""

    def __init__(self, worker_class: type) -> None:
        self.worker_class = worker_class

    def init_worker(self) -> Any:
        return self.worker_class()


def _unmarked_run(recorder: mstx_marks.Recorder, tmp_path: Path) -> Path:
    """A vLLM engine process that marks every expected phase but builds an ``NPUWorker``
    (a class of its own each call: the producer says each class once) no preset wraps."""
    worker = type("NPUWorker", (), {"execute_model": lambda self: None})
    worker.__module__ = WORKER_MODULE
    row = built.Built("vllm", __name__, "_Engine.init_worker", ("execute_model", "absent"),
                      built=lambda self, result: result)  # fmt: skip
    with (
        built.watch_built(row, _Engine, lambda module, path: f"mark {module}:{path}"),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # (the producer's warning: not what is tested here)
        with mstx_marks.mark("step"):
            _Engine(worker).init_worker()
            for name in EXPECTATIONS["vllm"]:
                with mstx_marks.mark(name):
                    pass
    records = recorder.records()
    said = [r for r in records if isinstance(r, InstantRecord)]
    assert [(r.name, r.domain) for r in said] == [
        (f"uncovered {WORKER_MODULE}:NPUWorker.execute_model", stages.UNCOVERED_DOMAIN)
    ]
    export_rank(tmp_path, RankTrace(0, records, role="EngineCore"))
    return tmp_path


def test_a_class_run_unmarked_is_named_per_process_and_fails_coverage(
    recorder: mstx_marks.Recorder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _unmarked_run(recorder, tmp_path)
    traces, errors, _ = load_traces(out)
    assert errors == []
    report = check_coverage(traces, expected_phases("vllm"))
    assert report.missing == [] and not report.ok  # every phase emitted, and still failed
    assert report.unmarked == {"EngineCore rank 0": [f"{WORKER_MODULE}:NPUWorker.execute_model"]}
    assert report.unmarked_lines() == [f"{SAID} ({WORKER_MODULE})"]
    doc = report.to_json()
    assert doc["ok"] is False and doc["unmarked"] == [
        {"process": "EngineCore rank 0", "method": "NPUWorker.execute_model",
         "module": WORKER_MODULE}
    ]  # fmt: skip
    assert json.loads(json.dumps(doc)) == doc
    main(["coverage", str(out), "--expect", "vllm"])
    lines = capsys.readouterr().out.splitlines()
    assert f"{SAID} ({WORKER_MODULE})" in lines
    assert lines[-1].startswith("UNMARKED: every one of the 3 expected phases was emitted")
    # Both files of the process (its Chrome trace and its database) carry the instant.
    files = find_trace_files(out)
    assert len(files) == 2
    for path in files:
        (part,) = part_of_file(path)
        assert part.unmarked == [f"{WORKER_MODULE}:NPUWorker.execute_model"], path


def test_the_command_exits_1_for_a_class_run_unmarked(
    recorder: mstx_marks.Recorder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _unmarked_run(recorder, tmp_path)
    assert main(["coverage", str(out), "--expect", "vllm"]) == 1
    capsys.readouterr()
    assert main(["coverage", str(out), "--expect", "vllm", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert any(p["unmarked"] for p in report["processes"].values())


def test_a_class_run_unmarked_is_a_note_of_the_summary_not_a_phase(
    recorder: mstx_marks.Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _unmarked_run(recorder, tmp_path)
    held = summarize(load_traces(out)[0])
    streamed = summarize_path(out, jobs=1)
    monkeypatch.setattr(chrome_json, "WHOLE_JSON_BYTES", 64)  # an event at a time,
    monkeypatch.setattr(stream, "MAX_HELD_EVENTS", 2)  # in one pass
    one_pass = summarize_path(out / "chrome", jobs=1)
    for s in (held, streamed, one_pass):
        (note,) = [n for n in s.notes if "ran unmarked" in n]
        assert note.endswith(f": {SAID}")
        assert not [p for p in s.phases if "uncovered" in p.name or "NPUWorker" in p.name]
        assert [p.name for p in s.phases if not p.is_step] == list(EXPECTATIONS["vllm"])
        assert "uncovered" not in json.dumps(format_json(s)["phases"])
    assert [n for n in one_pass.notes if "summarised in one pass" in n]
