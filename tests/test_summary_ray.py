"""``summary --ray``: traces on each node's own disk, read by a task pinned to that node, merged.

One real Ray 2.60 cluster (``ray.cluster_utils.Cluster``: a head and two worker nodes, one CPU
each, in the rl venv; ``tests/engines/summary_ray.py`` says what it writes and does). Its nodes
share this host's disk, so each node's folder is ``nodes/<node id>`` and the path given is
``nodes/{node_id}``: the same tree, read here, is "every node's folder copied together", the
summary the merged one must equal. Without Ray, ``--ray`` says so (last test).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.engine_run import clean_env, read_json, scenario, venv_python

from mstx_marks.analysis.model.quantiles import RELATIVE_ERROR
from mstx_marks.analysis.model.spans import SHIP_LIMIT
from mstx_marks.analysis.summary import format_json, summarize_path
from mstx_marks.cli.main import main

RAY_TIMEOUT_S = 300
#: The member whose two processes lie on two nodes (summed from each node's one-pass reading).
SPREAD = ("EngineCore_DP0", "EngineCore_DP0:0")


@dataclass
class Run:
    result: dict[str, Any]
    work: Path

    @property
    def ids(self) -> list[str]:
        """The head's node id, then the two workers'."""
        return list(self.result["nodes"])


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    python = venv_python("rl")
    work = tmp_path_factory.mktemp("ray-summary")
    result = work / "result.json"
    env = clean_env(RAY_USAGE_STATS_ENABLED="0")
    scenario(python, "summary_ray.py", [work, result], env, timeout=RAY_TIMEOUT_S, cwd=work).run()
    return Run(read_json(result), work)


@pytest.fixture(scope="module")
def local(ray_run: Run) -> dict[str, Any]:
    """The summary of every node's folder, read here."""
    return format_json(summarize_path(ray_run.work / "nodes", jobs=1, progress=False))


def _close(a: float | None, b: float | None, error: float) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=error, abs_tol=1e-9)


def _same_stats(ray: dict[str, Any], here: dict[str, Any], spread: bool) -> None:
    for key in ("count", "total_ns", "mean_ns", "max_ns", "step_share"):
        assert _close(ray[key], here[key], 1e-12), key
    for key in ("p50_ns", "p90_ns"):
        assert _close(ray[key], here[key], max(ray["percentile_error"], RELATIVE_ERROR)), key
    if spread:  # summed in one pass: no self time, as for a spill too large to hold
        assert ray["self_ns"] is None
    else:
        assert ray["self_ns"] == here["self_ns"]


def test_the_merged_summary_is_the_summary_of_the_folders_copied_together(
    ray_run: Run, local: dict[str, Any]
) -> None:
    ray = ray_run.result["ray"]["json"]
    assert local["errors"] == [] and ray["errors"] == []
    assert ray["roles"] == local["roles"] == [
        "EngineCore_DP0", "RewardWorker", "TaskRunner", "WorkerDict"
    ]  # fmt: skip
    assert ray["ranks"].keys() == local["ranks"].keys()
    for key, member in ray["ranks"].items():
        here = local["ranks"][key]
        if key == SPREAD[1]:
            assert member["steps"] == here["steps"] == 8  # each process's four, one after other
            assert member["step_keys"] == here["step_keys"]
            assert member["step_time_ns"] == here["step_time_ns"] > 0
            assert member["unmarked_ns"] is None and here["unmarked_ns"] is not None
            assert any(here[k] for k in ("unmarked_ns", "concurrent_ns"))  # what Ray's lacks
        else:
            assert member == here  # source, steps, step time, breakdown: all of it
    assert [(p["role"], p["name"]) for p in ray["phases"]] == [
        (p["role"], p["name"]) for p in local["phases"]
    ]
    for mine, theirs in zip(ray["phases"], local["phases"]):
        spread = mine["role"] == SPREAD[0]
        _same_stats(mine["all"], theirs["all"], spread)
        assert mine["ranks"].keys() == theirs["ranks"].keys()
        for rank, stats in mine["ranks"].items():
            _same_stats(stats, theirs["ranks"][rank], spread)
        assert mine["imbalance"] == theirs["imbalance"]
        assert mine["slowest_rank"] == theirs["slowest_rank"]
    # the per-step partials travel inside the same parts
    assert ray["per_step"] is not None and local["per_step"] is not None
    assert json.dumps(ray["per_step"], sort_keys=True) == json.dumps(
        local["per_step"], sort_keys=True
    )


def test_each_node_is_read_by_a_task_on_that_node(ray_run: Run) -> None:
    reads = ray_run.result["ray"]["reads"]
    assert sorted(r["node"]["node_id"] for r in reads) == sorted(ray_run.ids)
    for r in reads:
        assert r["ran_on"] == r["node"]["node_id"]  # what the task saw from inside
        assert r["path"] == str(ray_run.work / "nodes" / r["ran_on"])  # {node_id}, made its own
        assert r["error"] == ""
    by_id = {r["node"]["node_id"]: r for r in reads}
    head, one, two = (by_id[i] for i in ray_run.ids)
    assert not head["found"] and head["files"] == 0  # no folder there: said, not an error
    assert (one["files"], two["files"]) == (12, 6)  # a Chrome trace and a database a process
    notes = ray_run.result["ray"]["json"]["notes"]
    assert notes[0].endswith("read on 3 of 3 nodes (18 trace files; "
                             f"{notes[0].rsplit('; ', 1)[1]}")  # fmt: skip
    assert any("no such folder on 1 node(s)" in n and head["path"] in n for n in notes)
    spread = [n for n in notes if n.startswith("EngineCore_DP0 rank 0: its processes' files")]
    assert len(spread) == 1 and "lie on 2 nodes" in spread[0]


def test_the_command_prints_what_the_local_summary_prints(
    ray_run: Run, local: dict[str, Any]
) -> None:
    cli = ray_run.result["cli"]
    assert cli["rc"] == 0
    printed = json.loads(cli["stdout"])
    assert printed["phases"] == ray_run.result["ray"]["json"]["phases"]
    assert [p["name"] for p in printed["phases"]] == [p["name"] for p in local["phases"]]
    assert "note: Ray cluster " in cli["stderr"] and "read on 3 of 3 nodes" in cli["stderr"]
    svg = ray_run.result["svg"]  # pictures need every range: refused, before any read
    assert svg["rc"] == 2 and "--svg, --html and --trace" in svg["stderr"] and not svg["stdout"]


def test_coverage_reads_the_same_parts_on_the_nodes(ray_run: Run) -> None:
    cov = ray_run.result["coverage"]
    assert cov["rc"] == 1
    lines = cov["stdout"].splitlines()
    assert lines[-1] == "MISSING in every process: compute_ref_log_prob"
    assert len(lines) == 8  # the seven members, from both workers, then the verdict
    assert "WorkerDict rank 3: 3/4 expected phases" in cov["stdout"]  # worker 2's
    assert "read on 3 of 3 nodes" in cov["stderr"]


def test_diff_reads_both_runs_on_the_nodes(ray_run: Run) -> None:
    diff = ray_run.result["diff"]
    assert diff["rc"] in (0, 1), diff["stderr"]  # 1: a row grew (no threshold: never)
    doc = json.loads(diff["stdout"])
    assert doc["base"].startswith("base ") and "{node_id}" in doc["base"]
    roles = {r["role"] for r in doc["rows"]}
    assert {"WorkerDict", "EngineCore_DP0"} <= roles  # base's from both workers, new's from one


def test_only_partial_aggregates_cross_whatever_the_events(ray_run: Run) -> None:
    """The same process (10 steps, the same phases) with 1e3 and 1e5 events: what its node
    sends back does not grow with the events (durations travel only while a phase has at most
    SAMPLE_LIMIT, as they do from a local worker; its spans are joined down to SHIP_LIMIT,
    while the small one's, fewer, are sent whole), and is a sliver of the file."""
    small, big = (ray_run.result["payload"][k] for k in ("small", "big"))
    assert (small["events"], big["events"]) == (1_030, 100_030)
    sent_small, sent_big = (p["reads"][0]["sent_bytes"] for p in (small, big))
    span_bytes = 3 * 8  # (a span: its start, end and cover)
    assert 0 < sent_big <= sent_small + span_bytes * SHIP_LIMIT  # 100x the events: bounded
    assert sent_big * 100 < big["file_bytes"]  # (under 1 %: 2,048 spans of 100,000 ranges)
    for p in (small, big):
        counts = {q["name"]: q["all"]["count"] for q in p["json"]["phases"]}
        assert sum(counts.values()) == p["events"]  # every range counted on the node


def test_a_dead_or_unknown_node_is_reported_and_the_others_still_read(ray_run: Run) -> None:
    dead = ray_run.result["dead"]
    gone = ray_run.ids[2]
    errors = dead["json"]["errors"]
    failed = [r for r in dead["reads"] if r["error"]]
    assert [r["node"]["node_id"] for r in failed] == [gone]
    assert errors == [
        f"1 Ray node(s) dead, their traces not read: {failed[0]['node']['ip']} ({gone[:8]})"
    ]
    assert f"not read: {failed[0]['node']['ip']} ({gone[:8]})" in dead["json"]["notes"][0]
    assert sorted(dead["json"]["ranks"]) == [  # worker 2's ranks are gone; the rest are read
        "EngineCore_DP0:0", "RewardWorker:0", "TaskRunner:0", "WorkerDict:0", "WorkerDict:1"
    ]  # fmt: skip
    unknown = ray_run.result["unknown"]
    bad = [r for r in unknown["reads"] if r["node"]["node_id"] == "ab" * 28]
    assert len(bad) == 1 and "TaskUnschedulableError" in bad[0]["error"]
    assert any("ab" * 4 in e for e in unknown["json"]["errors"])
    assert "WorkerDict:1" in unknown["json"]["ranks"]
    assert ray_run.result["closed"]  # the reader that connected disconnected


def test_without_ray_the_flag_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # (import ray raises, installed or not)
    for argv in (["summary", str(tmp_path), "--ray", "auto"],
                 ["coverage", str(tmp_path), "--expect", "demo", "--ray", "auto"]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --ray needs Ray in this Python")
