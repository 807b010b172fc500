"""Run inside the rl venv: ``summary --ray`` on a real Ray 2.60 cluster of three nodes on one host.

``WORK RESULT``: starts a ``ray.cluster_utils.Cluster`` (a head and two worker nodes, one CPU
each). Nodes of one host share its disk, so each node's "local" folder is
``WORK/nodes/<its node id>``, written by a task pinned to that node (Chrome traces and databases
by ``export_rank``, one run id):

- head: nothing (no folder: the head often runs no rank);
- worker 1: ``TaskRunner`` rank 0, ``WorkerDict`` ranks 0 and 1, ``EngineCore_DP0`` rank 0, and
  ``RewardWorker`` rank 0 as two processes (a restarted worker: read again together there);
- worker 2: ``WorkerDict`` ranks 2 and 3, and another ``EngineCore_DP0`` rank 0 (one member
  whose processes lie on two nodes).

Durations differ per node. This process connects through a
:class:`~mstx_marks.analysis.readers.cluster.RayReader` (its ``ray.init``), summarises
``WORK/nodes/{node_id}`` with it (what each node's task did, the summary's JSON), runs
``mstx-marks summary ... --ray ADDRESS --json``, ``coverage`` and ``diff`` as a user would (in
this process: a new driver would start new workers on every node, ten seconds here), measures
the parts one node sends back for one process of 1e3 and of 1e5 events (same steps and phases;
``WORK/payload/{small,big}/<node id>``), reads a node id the cluster does not know, removes
worker 2 and reads again (a dead node), and closes the reader (which ends the connection).

Writes RESULT as JSON. (Ray is imported inside the functions: pytest's ``--doctest-modules``
imports this file in the test process too.)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

T0 = 1_760_000_000_000_000_000
RUN = "job-ray-1"
#: (node index, role, rank, pid, decodes per step): what each node's disk holds.
LAYOUT = [
    (1, "TaskRunner", 0, 100, 3),
    (1, "WorkerDict", 0, 200, 6),
    (1, "WorkerDict", 1, 201, 6),
    (1, "EngineCore_DP0", 0, 300, 8),
    (1, "RewardWorker", 0, 400, 2),
    (1, "RewardWorker", 0, 401, 2),
    (2, "WorkerDict", 2, 202, 6),
    (2, "WorkerDict", 3, 203, 6),
    (2, "EngineCore_DP0", 0, 301, 8),
]
STEPS = 4


def process_trace(rank: int, role: str, pid: int, steps: int, decodes: int, scale: int) -> Any:
    """GRPO-shaped steps of one process: gen around ``decodes`` decode ranges, update_actor."""
    from mstx_marks.base.records import RangeRecord
    from mstx_marks.export import RankTrace

    recs = []
    t = T0 + pid * 7_000
    tid = pid * 10
    for k in range(steps):
        start = t
        d_t = t + 10
        for d in range(decodes):
            dur = (50 + (k * 7 + d * 13 + rank * 5 + pid) % 40) * scale
            recs.append(RangeRecord("vllm_one_step", "vllm_one_step", d_t, d_t + dur, tid, pid))
            d_t += dur + 5
        recs.append(RangeRecord("gen", "default", t + 10, d_t, tid, pid))
        u = d_t + 20
        ud = (300 + rank * 17 + k * 3 + pid % 7) * scale
        recs.append(RangeRecord("update_actor", "default", u, u + ud, tid, pid))
        end = u + ud + 10
        recs.append(RangeRecord("step", "default", start, end, tid, pid))
        t = end + 100
    recs.sort(key=lambda r: r.start_ns)
    return RankTrace(rank, recs, role=role, run=RUN)


def write_node(root: str, index: int) -> dict[str, Any]:
    """A task on one node: its processes' files under ``root/<this node's id>``."""
    import ray

    from mstx_marks.export import export_rank

    node_id = ray.get_runtime_context().get_node_id()
    out = Path(root) / node_id
    for i, role, rank, pid, decodes in LAYOUT:
        if i == index:
            trace = process_trace(rank, role, pid, STEPS, decodes, scale=index + 1)
            export_rank(out, trace, process=f"node{index}-{pid}")
    return {"node_id": node_id, "pid": os.getpid()}


def write_payload(root: str, decodes: int) -> dict[str, Any]:
    """A task on one node: one process of 10 steps, ``decodes`` decode ranges each."""
    import ray

    from mstx_marks.export import chrome_trace_path, write_chrome_trace

    node_id = ray.get_runtime_context().get_node_id()
    trace = process_trace(0, "EngineCore_DP0", 500, 10, decodes, scale=1)
    path = chrome_trace_path(Path(root) / node_id, 0, "payload-500", trace.role)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_chrome_trace(path, [trace])
    return {"events": len(trace.records), "file_bytes": path.stat().st_size}


def on(node_id: str, fn: Any, *args: Any) -> Any:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    where = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return ray.get(ray.remote(num_cpus=0)(fn).options(scheduling_strategy=where).remote(*args))


def read(address: str, path: Path, nodes: list[str] | None = None) -> dict[str, Any]:
    """``path`` summarised on the nodes (all, or ``nodes``): what each node did, the JSON."""
    from mstx_marks.analysis.readers.cluster import RayReader
    from mstx_marks.analysis.summary import format_json, summarize_path

    with RayReader(address, nodes) as reader:
        summary = summarize_path(path, progress=False, reader=reader)
        return {"reads": [asdict(r) for r in reader.nodes], "json": format_json(summary)}


def command(*argv: str) -> dict[str, Any]:
    """``mstx-marks ARGV`` in this process: its exit status, stdout and stderr."""
    from mstx_marks.cli.main import main as cli

    said, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(err):
        rc = cli(list(argv))
    return {"rc": rc, "stdout": said.getvalue(), "stderr": err.getvalue()}


def main(work: Path, result: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from mstx_marks.analysis.readers.cluster import RayReader

    began = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    connection = RayReader(cluster.address)  # this process's ray.init
    out: dict[str, Any] = {"started_s": time.monotonic() - began}
    ids = [cluster.head_node.node_id, *(w.node_id for w in workers)]
    out["nodes"] = ids
    out["written"] = [on(n, write_node, str(work / "nodes"), i) for i, n in enumerate(ids)]
    template = work / "nodes" / "{node_id}"
    out["ray"] = read(cluster.address, template)

    out["cli"] = command("summary", str(template), "--ray", cluster.address, "--json")
    expect = "step,generate_sequences,update_actor,compute_ref_log_prob"
    out["coverage"] = command(
        "coverage", str(template), "--ray", cluster.address, "--expect", expect
    )
    out["svg"] = command("summary", str(template), "--ray", cluster.address, "--svg", "t.svg")

    payload: dict[str, Any] = {}
    for size, decodes in (("small", 100), ("big", 10_000)):
        folder = work / "payload" / size
        payload[size] = on(ids[1], write_payload, str(folder), decodes)
        payload[size].update(read(cluster.address, folder / "{node_id}", [ids[1]]))
    out["payload"] = payload
    small = work / "payload" / "small" / "{node_id}"
    out["diff"] = command("diff", str(template), str(small), "--ray", cluster.address, "--json")

    out["unknown"] = read(cluster.address, template, [ids[1], "ab" * 28])
    cluster.remove_node(workers[1])
    out["dead"] = read(cluster.address, template)
    connection.close()
    out["closed"] = not ray.is_initialized()
    out["elapsed_s"] = time.monotonic() - began
    result.write_text(json.dumps(out))
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
