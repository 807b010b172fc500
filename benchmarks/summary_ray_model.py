"""``summary DIR --ray`` at 1,000 ranks x 1e6 events: a model from what is measured here.

Measured on this machine, one core, in this process (each step says how):

1. **Per-file throughput.** One process's file of ``--events`` events (default 2e5; ``--steps``
   steps, each ``step`` around ``gen`` around its decode ranges, then ``old_log_prob``,
   ``reward``, ``update_actor``) in each kind a process with ``MSTX_MARKS_OUT`` leaves: its spill
   (the real :class:`~mstx_marks.export.spill.Spill` writer), our Chrome trace and its Ascend
   database (the real exporters). ``part_of_file`` (what a node's task runs per file) is timed:
   events/s per core.
2. **Payload.** The pickled parts of each file (what a node sends back per file), at
   ``--events`` and at a tenth of it: bounded by the phases and steps, not the events.
3. **Merge.** The caller's side of ``summarize_path`` (runs, copies, combine, per-step
   analysis) on ``--merge`` files' parts handed over by a stand-in reader (one per kind per
   rank, copies of the measured parts), timed; taken as linear in the parts.

The model (printed with its inputs) for ``--ranks`` ranks of ``--target`` events, ``--per-node``
ranks per node of ``--cores`` CPUs:

- a node reads its ranks' files with as many processes as :func:`~mstx_marks.analysis.summary.
  memory_jobs` allows it (the real function, on the peak estimates of the files at the target
  size: sparse files of that size, :func:`~mstx_marks.analysis.readers.peak_estimate`), each at
  the measured rate, taken as linear in the events (the held path sorts: n log n, slightly
  optimistic at 5x the measured size; summary_memory.py measured 1e6 directly);
- the nodes read at once: the read takes as long as one node's;
- ASSUMED: Ray's task round trip ``--ray-overhead`` s (0.4 to 1 s measured by
  tests/test_summary_ray.py on one host, 3 nodes, a warm job), the network ``--net-gbps``
  GB/s for the parts (and for copying the files to one machine, the local alternative);
- the caller merges every rank's copies at the measured rate;
- each summary (a node's task, or the one host) reads as many files at once as keep their peak
  estimates within :data:`~mstx_marks.analysis.summary.MEMORY_BUDGET` (1 GB): a file of 1e6
  events is estimated at 650 MB, so one at a time. A second row shows ``--budget-gb`` (32).

Against it: the files copied to one machine (``--cores`` CPUs, one ``MEMORY_BUDGET``) and read
there, as msprof-analyze and a local summary must.

Run it from the repository root: ``python3 benchmarks/summary_ray_model.py`` (about a minute;
``--quick`` for 2e4 events). Files are kept under ``--work`` and reused.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import pickle
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mstx_marks.analysis.model.aggregate import ProcessPart  # noqa: E402
from mstx_marks.analysis.model.steps import StepOptions  # noqa: E402
from mstx_marks.analysis.readers import part_of_file, peak_estimate  # noqa: E402
from mstx_marks.analysis.summary import (  # noqa: E402
    MEMORY_BUDGET,
    FilesRead,
    MemberFiles,
    Reading,
    memory_jobs,
    summarize_path,
)
from mstx_marks.backends.record import Recorder  # noqa: E402
from mstx_marks.base.records import RangeRecord, RankTrace, Record  # noqa: E402
from mstx_marks.export.ascend_db import write_ascend_db  # noqa: E402
from mstx_marks.export.chrome import write_chrome_trace  # noqa: E402
from mstx_marks.export.spill import Spill  # noqa: E402

KINDS = ("spill", "chrome", "db")
#: Ranges of a step besides its decodes: step, gen, old_log_prob, reward, update_actor.
FRAME = 5
T0 = 1_750_000_000_000_000_000


def _decodes(events: int, steps: int) -> int:
    return max(events // steps - FRAME, 1)


def step_records(events: int, steps: int, pid: int = 4242) -> list[Record]:
    """About ``events`` ranges in ``steps`` steps (see the module's docstring), one thread."""
    records: list[Record] = []
    tid = pid + 1
    t = T0
    for n in range(steps):
        start = t
        d_t = t + 10
        for d in range(_decodes(events, steps)):
            dur = 3_000 + (n * 31 + d * 17) % 977
            records.append(RangeRecord("vllm_one_step", "vllm", d_t, d_t + dur, tid, pid))
            d_t += dur + 50
        records.append(RangeRecord("gen", "default", t + 10, d_t, tid, pid))
        for name in ("old_log_prob", "reward", "update_actor"):
            records.append(RangeRecord(name, "default", d_t + 100, d_t + 20_100, tid, pid))
            d_t += 20_200
        records.append(RangeRecord("step", "default", start, d_t + 100, tid, pid))
        t = d_t + 1_000
    records.sort(key=lambda r: r.start_ns)
    return records


def build(root: Path, kind: str, events: int, steps: int) -> Path:
    """One process's file of ``kind`` (made once, kept under ``root``)."""
    folder = root / f"{kind}-{events}-{steps}"
    done = folder / ".complete"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        if kind == "spill":
            rec = Recorder(capacity=1 << 20)
            spill = Spill(folder, rec, rank=0, role="trainer", run="bench")
            start, end = rec.range_start, rec.range_end
            for n in range(steps):
                step, gen = start("step", "default"), start("gen", "default")
                for _ in range(_decodes(events, steps)):
                    end(start("vllm_one_step", "vllm"), "vllm")
                end(gen, "default")
                for name in ("old_log_prob", "reward", "update_actor"):
                    end(start(name, "default"), "default")
                end(step, "default")
                if n % 10 == 9:
                    spill.write_now()
            spill.write_now(final=True)
        else:
            trace = RankTrace(0, step_records(events, steps), role="trainer", run="bench")
            if kind == "db":
                write_ascend_db(folder / "ascend_pytorch_profiler_0.db", trace)
            else:
                write_chrome_trace(folder / "trainer-rank0-bench-1.trace.json", [trace])
        done.write_text("")
    return next(p for p in folder.rglob("*") if p.is_file() and p.name != ".complete")


@dataclass
class Measured:
    kind: str
    events: int
    bytes: int
    seconds: float
    sent: int  # pickled parts of the file
    sent_tenth: int  # the same at a tenth of the events
    parts: list[ProcessPart]

    @property
    def rate(self) -> float:
        return self.events / self.seconds


def measure(root: Path, kind: str, events: int, steps: int) -> Measured:
    path = build(root, kind, events, steps)
    small = build(root, kind, max(events // 10, steps * (FRAME + 1)), steps)
    part_of_file(small)  # warm: imports, the registry
    best = math.inf
    for _ in range(2):
        began = time.perf_counter()
        parts = part_of_file(path)
        best = min(best, time.perf_counter() - began)
    counted = sum(a.count for p in parts for a in p.phases.values())
    sent = len(pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL))
    tenth = len(pickle.dumps(part_of_file(small), protocol=pickle.HIGHEST_PROTOCOL))
    return Measured(kind, counted, path.stat().st_size, best, sent, tenth, parts)


class _Handed:
    """A reader that hands over parts already made (what the nodes would send back)."""

    def __init__(self, results: list[tuple[Path, Reading]]) -> None:
        self.results = results

    def files(self, root: Path, steps: StepOptions, jobs: int | None, progress: bool) -> FilesRead:
        return FilesRead(self.results, [], [])

    def members(self, items: Sequence[MemberFiles], jobs: int | None) -> list[Reading]:
        raise AssertionError("every process is one file per kind here")


def merge_seconds(measured: list[Measured], ranks: int) -> float:
    """The caller's side for ``ranks`` ranks, each with one file of every kind measured."""
    results: list[tuple[Path, Reading]] = []
    for rank in range(ranks):
        for m in measured:
            parts = copy.deepcopy(m.parts)
            for p in parts:
                p.rank, p.pids = rank, frozenset({10_000 + rank})
                p.source = Path(f"/node{rank // 8}/{m.kind}/{rank}")
            results.append((Path(f"/node{rank // 8}/{m.kind}/{rank}"), ("ok", parts)))
    began = time.perf_counter()
    summary = summarize_path("/cluster", progress=False, reader=_Handed(results))
    took = time.perf_counter() - began
    assert len(summary.step_time_ns) == ranks and not summary.errors, summary.errors
    return took


def jobs_for(root: Path, sizes: dict[str, int], files_per_kind: int, cpus: int, budget: int) -> int:
    """:func:`memory_jobs` of ``files_per_kind`` files of each size (sparse files: only the
    size counts, as ``peak_estimate`` reads it)."""
    names = {
        "spill": "spill/h-1.jsonl",
        "chrome": "r.trace.json",
        "db": "a/ascend_pytorch_profiler_0.db",
    }
    estimates = []
    for kind, size in sizes.items():
        path = root / "sparse" / names[kind]
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(size)
        estimates += [peak_estimate(path)] * files_per_kind
    return memory_jobs(estimates, cpus, budget)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000, help="events per measured file")
    ap.add_argument("--steps", type=int, default=100, help="steps per process")
    ap.add_argument("--merge", type=int, default=300, help="ranks whose parts are merged")
    ap.add_argument("--ranks", type=int, default=1_000)
    ap.add_argument("--target", type=float, default=1e6, help="events per rank, modelled")
    ap.add_argument("--per-node", type=int, default=8, help="ranks per node")
    ap.add_argument("--cores", type=int, default=64, help="CPUs per node (and of the one host)")
    ap.add_argument("--ray-overhead", type=float, default=1.0, help="s, ASSUMED")
    ap.add_argument("--net-gbps", type=float, default=1.0, help="GB/s, ASSUMED")
    ap.add_argument("--budget-gb", type=float, default=32, help="a larger memory budget")
    ap.add_argument("--quick", action="store_true", help="2e4 events, 100 ranks merged")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "mstx-ray-model")
    args = ap.parse_args()
    if args.quick:
        args.events, args.merge = 20_000, 100
    measured = [measure(args.work, kind, args.events, args.steps) for kind in KINDS]
    print(f"measured: one core ({os.cpu_count()} here), {args.steps} steps per process")
    for m in measured:
        print(
            f"  {m.kind:6} {m.events:>9,} events {m.bytes / 1e6:7.1f} MB  {m.seconds:6.2f} s"
            f"  {m.rate:>9,.0f} events/s  parts {m.sent / 1e3:6.1f} KB"
            f" ({m.sent_tenth / 1e3:.1f} KB at a tenth of the events)"
        )
    merge = merge_seconds(measured, args.merge)
    per_file_merge = merge / (args.merge * len(measured))
    print(
        f"  merge  {args.merge * len(measured):,} files' parts ({args.merge} ranks): {merge:.2f} s"
    )

    scale = args.target / args.events
    sizes = {m.kind: int(m.bytes * scale) for m in measured}
    work = sum(args.target / m.rate for m in measured)  # one rank's files, core-seconds
    longest = max(args.target / m.rate for m in measured)  # one file, one core
    nodes = math.ceil(args.ranks / args.per_node)
    sent = args.ranks * sum(m.sent for m in measured)
    transfer = sent / (args.net_gbps * 1e9)
    merge_all = per_file_merge * args.ranks * len(measured)
    copied = args.ranks * sum(sizes.values())
    copy_s = copied / (args.net_gbps * 1e9)
    print(
        f"model: {args.ranks:,} ranks x {args.target:.0e} events, {args.per_node} ranks per node"
        f" ({nodes} nodes) of {args.cores} CPUs; files per rank: {', '.join(KINDS)}"
    )
    print(
        f"  per rank: {sum(sizes.values()) / 1e6:,.0f} MB of files, {work:.1f} core-s to read"
        f" (its slowest file {longest:.1f} s); parts sent back {sent / 1e6:,.0f} MB in all,"
        f" {transfer:.2f} s; merge {merge_all:.1f} s"
    )
    for label, budget in (
        ("MEMORY_BUDGET (1 GB)", MEMORY_BUDGET),
        (f"{args.budget_gb:g} GB per summary", int(args.budget_gb * (1 << 30))),
    ):
        node_jobs = jobs_for(args.work, sizes, args.per_node, args.cores, budget)
        node_read = max(args.per_node * work / node_jobs, longest)
        ray_total = args.ray_overhead + node_read + transfer + merge_all
        host_jobs = jobs_for(args.work, sizes, args.ranks, args.cores, budget)
        local_read = max(args.ranks * work / host_jobs, longest)
        local_total = copy_s + local_read + merge_all
        print(
            f"  {label}: {node_jobs} files at once per node, {host_jobs} on one host\n"
            f"    --ray : node read {node_read:7.1f} s + Ray {args.ray_overhead:.1f} s (assumed)"
            f" + parts {transfer:5.2f} s + merge {merge_all:5.1f} s = {ray_total:7.1f} s\n"
            f"    copied: {copied / 1e9:,.0f} GB at {args.net_gbps:g} GB/s {copy_s:7.0f} s + read"
            f" {local_read:7.0f} s + merge {merge_all:5.1f} s = {local_total:7.0f} s"
        )


if __name__ == "__main__":
    main()
