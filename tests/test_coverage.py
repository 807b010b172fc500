"""``mstx-marks coverage``: the expected phases a run never emitted, per process; exit 1 if any."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.recorded import rng

from mstx_marks.analysis.coverage import EXPECTATIONS, check_coverage, expected_phases
from mstx_marks.base.records import RankTrace
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
