"""Real profiler captures, read in place from ``../shared/realcap`` (its README names each one's
source and the values computed by hand from the raw files), to those values: through the
Python API (the streamed summary and the in-memory one the timelines use) and through
``mstx-marks summary DIR --json``. One test per capture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mstx_marks.analysis.readers import find_trace_files, part_of_file
from mstx_marks.analysis.summary import Summary, load_traces, summarize, summarize_path
from mstx_marks.base.records import Member
from mstx_marks.cli.main import main as cli_main

REALCAP = Path(__file__).resolve().parent.parent.parent / "shared" / "realcap"


def capture(*parts: str) -> Path:
    """A capture in ``../shared/realcap``, read where it lies; the test is skipped without it."""
    path = REALCAP.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path}: the shared real captures are not here (../shared/realcap)")
    return path


def ms(ns: float) -> float:
    return round(ns / 1e6, 3)


def both(path: Path) -> list[Summary]:
    """The summary of ``path`` streamed (what the command runs) and read into memory."""
    streamed = summarize_path(path, jobs=1, progress=False)
    traces, errors, notes = load_traces(path)
    held = summarize(traces)
    held.errors, held.notes = errors, notes + held.notes
    return [streamed, held]


def cli_json(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    code = cli_main(["summary", str(path), "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def phase(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [p for p in doc["phases"] if p["name"] == name]
    return found


def test_torch_npu_text_export_of_two_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    root = capture("torchnpu_text_2rank")
    for s in both(root):
        assert s.errors == [] and s.members() == [Member("", 0), Member("", 1)]
        assert s.step_keys == {Member("", 0): ["50"], Member("", 1): ["50"]}
        assert {m.rank: ms(t) for m, t in s.step_time_ns.items()} == {0: 155.986, 1: 153.888}
        assert [p.name for p in s.phases] == ["ProfilerStep"]  # no MSTX: no other phase
    code, doc, _ = cli_json(root, capsys)
    assert code == 0 and sorted(doc["ranks"]) == ["0", "1"]
    assert {k: (r["step_keys"], ms(r["step_time_ns"])) for k, r in doc["ranks"].items()} == {
        "0": (["50"], 155.986), "1": (["50"], 153.888),
    }  # fmt: skip


def test_torch_npu_database_without_mstx_events_reads_its_steps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = capture("torchnpu_db_2rank")
    for s in both(root):
        assert s.errors == [] and s.phases == []
        assert s.step_keys == {Member("", 0): ["50"], Member("", 1): ["50"]}  # STEP_TIME's id
        assert s.step_time_ns[Member("", 0)] == 1736410576538298460 - 1736410576386409710
        assert {m.rank: ms(t) for m, t in s.step_time_ns.items()} == {0: 151.889, 1: 148.265}
        (note,) = [n for n in s.notes if "no MSTX range was recorded" in n]
        assert "rank 0" in note and "rank 1" in note
    code, doc, err = cli_json(root, capsys)
    assert code == 0 and "no MSTX range was recorded" in err and "error" not in err
    assert {k: ms(r["step_time_ns"]) for k, r in doc["ranks"].items()} == {
        "0": 151.889, "1": 148.265,
    }  # fmt: skip


def test_msprof_database_found_bare_and_read_by_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = capture("msinsight_msprof_db")
    assert find_trace_files(root) == [root / "msprof_0.db"]  # msprof's name, found bare
    (part,) = part_of_file(root / "msprof_0.db")
    # The README's values: 13 ranges, 8 names, no steps, nothing merged.
    assert part.n_records == 13 and sum(a.count for a in part.phases.values()) == 13
    assert len(part.phases) == 8 and part.step_count == 0 and part.merged == {}
    # Its domains (STRING_IDS 38 and 6) are operator strings, not communication: by message.
    names = {
        56: "aclnnEmbedding_GatherV2AiCore_GatherV2",
        40: "INT64;INT64",
    }
    assert ms(part.phases[names[56]].total_ns) == 115336.093
    # Message 40's two ranges nest, but an operator string is no stage of the registry: both.
    assert part.phases[names[40]].count == 2 and ms(part.phases[names[40]].total_ns) == 1.077
    for s in both(root):
        assert s.errors == [] and s.step_count == {Member("", 0): 0}
        assert len(s.phases) == 8 and not any(p.automatic for p in s.phases)
        assert sum(p.overall.count for p in s.phases) == 13
        (gather,) = [p for p in s.phases if p.name == names[56]]
        assert ms(gather.overall.total_ns) == 115336.093
        (int64,) = [p for p in s.phases if p.name == names[40]]
        assert int64.overall.count == 2 and ms(int64.overall.total_ns) == 1.077
        assert not [n for n in s.notes if "nested directly" in n]
    code, doc, _ = cli_json(root, capsys)
    assert code == 0 and len(doc["phases"]) == 8
    assert sum(p["all"]["count"] for p in doc["phases"]) == 13
    assert ms(phase(doc, names[56])["all"]["total_ns"]) == 115336.093
    assert phase(doc, names[40])["all"]["count"] == 2
    assert ms(phase(doc, names[40])["all"]["total_ns"]) == 1.077


def test_older_torch_npu_trace_view_of_one_rank(capsys: pytest.CaptureFixture[str]) -> None:
    root = capture("mstt_trace_view_1rank")
    for s in both(root):
        assert s.errors == [] and s.step_count == {Member("", 0): 1}
        assert s.step_time_ns[Member("", 0)] == 14_091_970  # 14091.97 us
    code, doc, _ = cli_json(root, capsys)
    assert code == 0 and ms(doc["ranks"]["0"]["step_time_ns"]) == 14.092


def test_kineto_cuda_ddp_keeps_pytorchs_annotations_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = capture("hta_kineto", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    for s in both(path):
        assert s.errors == [] and s.members() == [Member("", 0)]
        assert s.step_keys[Member("", 0)] == ["101", "102", "103", "104", "105"]
        assert ms(s.step_time_ns[Member("", 0)]) == 394.141
        (fwd,) = [p for p in s.phases if p.name == "## forward ##"]  # the user's own
        assert fwd.overall.count == 5 and ms(fwd.overall.total_ns) == 145.938
        assert not fwd.automatic and fwd.overall.self_ns == fwd.overall.total_ns
        auto = {p.name for p in s.phases if p.automatic}
        assert auto == {
            "Optimizer.zero_grad#SGD.zero_grad", "DistributedDataParallel.forward",
            "nccl:broadcast", "nccl:all_reduce", "Optimizer.step#SGD.step",
        }  # fmt: skip
        assert all(p.overall.step_share is None for p in s.phases if p.automatic)
    code, doc, _ = cli_json(path, capsys)
    assert code == 0 and phase(doc, "## forward ##")["all"]["count"] == 5
    assert phase(doc, "DistributedDataParallel.forward")["automatic"] is True


def test_kineto_cpu_only_gloo_on_background_threads_is_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = capture("hta_kineto", "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    for s in both(path):
        member = Member("", 34)
        assert s.errors == [] and s.members() == [member]
        assert s.step_keys[member] == ["551"] and ms(s.step_time_ns[member]) == 210.109
        (gloo,) = [p for p in s.phases if p.name == "gloo:all_reduce"]
        assert gloo.automatic and gloo.overall.count == 10
        assert ms(gloo.overall.total_ns) == 2135.456
        assert gloo.overall.step_share is None and gloo.overall.self_ns is None  # not 1016 %
        # It takes nothing from the user's time: the step is all unmarked, none concurrent.
        assert s.unmarked_ns[member] == s.step_time_ns[member]
        assert s.concurrent_ns[member] == s.outside_ns[member] == 0
    assert cli_main(["summary", str(path)]) == 0
    table = capsys.readouterr().out
    head, _, apart = table.partition("automatic annotations")
    assert "gloo:all_reduce" in apart and "gloo:all_reduce" not in head
    assert "1016" not in table


def test_kineto_rocm_counts_the_host_steps_only(capsys: pytest.CaptureFixture[str]) -> None:
    path = capture("hta_kineto", "mi250_minitoy_train_ROCm6_2.pt.trace.json.gz")
    for s in both(path):
        (steps,) = [p for p in s.phases if p.name == "ProfilerStep"]
        assert steps.overall.count == 2  # not the gpu_user_annotation copy of ProfilerStep#1
        assert s.step_count == {Member("", 0): 2}
        assert s.step_time_ns[Member("", 0)] == 9_288_291 + 49_073
    code, doc, _ = cli_json(path, capsys)
    assert code == 0 and ms(doc["ranks"]["0"]["step_time_ns"]) == 9.337
