"""``summary`` at cluster scale, side by side with msprof-analyze's ``mstx_sum``.

Generates a cluster in torch_npu's database layout (``<host>_<pid>_<stamp>_ascend_pt/
ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_<rank>.db`` and ``profiler_info_<rank>.json``,
written by :func:`mstx_marks.export.write_ascend_db`), GRPO-shaped steps of MSTX ranges, and
measures ``python -m mstx_marks summary DIR --json`` in a fresh process: wall time and peak
memory of the whole process tree (the command and its worker processes, their RSS summed,
sampled every 10 ms). Then it runs the real ``msprof-analyze cluster -m mstx_sum`` and ours on a
smaller cluster (msprof-analyze took more than 900 s on 64 ranks x 1e5 events here) with a
timeout, and checks that both count every range.

Prints the three figures the README quotes:

    64 ranks x 100000 events: ... s (target <= 30 s)
    peak memory 64 ranks / 8 ranks: ...x (target <= 1.5x)
    msprof-analyze mstx_sum / ours on 8 ranks x 10000 events: ...x (ours must be faster)

Run it from the repository root: ``python3 benchmarks/summary_scale.py`` (``--quick`` for a
short run). Generated clusters are kept under ``--work`` and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mstx_marks.base.records import RangeRecord, Record  # noqa: E402
from mstx_marks.export import RankTrace, ascend_db_path, write_ascend_db  # noqa: E402

T0 = 1_750_000_000_000_000_000
#: One step: step, gen, 8 decode steps, log-probs, reward, update_actor (13 ranges).
PER_STEP = 13


def rank_trace(rank: int, events: int) -> RankTrace:
    """``events`` ranges of GRPO-shaped steps; durations vary per rank and step."""
    recs: list[Record] = []
    t = T0 + rank * 1000
    pid, tid = 10_000 + rank, 20_000 + rank
    step = 0
    while len(recs) + PER_STEP <= events:
        jitter = (step * 7919 + rank * 104_729) % 5000
        start = t
        t += 10
        gen_start = t
        for _ in range(8):
            d = 3000 + jitter % 977
            recs.append(RangeRecord("vllm_one_step", "vllm_one_step", t, t + d, tid, pid))
            t += d + 5
        recs.append(RangeRecord("gen", "default", gen_start, t, tid, pid))
        for name, d in (
            ("old_log_prob", 8000),
            ("reward", 2000 + jitter),
            ("update_actor", 20_000 + 30 * rank),
        ):
            recs.append(RangeRecord(name, "default", t, t + d, tid, pid))
            t += d + 5
        recs.append(RangeRecord("step", "default", start, t, tid, pid))
        t += 100
        step += 1
    return RankTrace(rank, sorted(recs, key=lambda r: r.start_ns))


def cluster(work: Path, ranks: int, events: int) -> Path:
    root = work / f"cluster_{ranks}x{events}"
    done = root / ".complete"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    t = time.monotonic()
    for rank in range(ranks):
        path = ascend_db_path(root, rank, worker=f"node{rank // 8}_{4000 + rank}", timestamp_ms=1)
        write_ascend_db(path, rank_trace(rank, events))
    done.write_text("")
    print(f"  generated {ranks} ranks x {events} events in {time.monotonic() - t:.1f} s")
    return root


def _tree_rss(pid: int) -> int:
    """RSS in bytes of ``pid`` and all its descendants."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total


def measure(
    cmd: list[str], timeout: float
) -> tuple[float, int, subprocess.CompletedProcess[str] | None]:
    """Wall seconds, peak tree RSS and the finished process (None on timeout)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tempfile.gettempdir(), env=env, start_new_session=True)  # fmt: skip
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _tree_rss(proc.pid))
            stop.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        stop.set()
        return time.monotonic() - start, peak, None
    stop.set()
    sampler.join()
    return (
        time.monotonic() - start,
        peak,
        subprocess.CompletedProcess(cmd, proc.returncode, out, err),
    )


def ours(root: Path, timeout: float = 600) -> tuple[float, int, dict[str, object]]:
    wall, peak, done = measure(
        [sys.executable, "-m", "mstx_marks", "summary", str(root), "--json"], timeout
    )
    if done is None or done.returncode != 0:
        raise SystemExit(f"summary failed: {done and done.stderr[-2000:]}")
    doc: dict[str, object] = json.loads(done.stdout)
    return wall, peak, doc


def check_counts(doc: dict[str, object], ranks: int, events: int) -> None:
    steps = events // PER_STEP
    want = {
        "vllm_one_step": 8 * steps * ranks,
        "update_actor": steps * ranks,
        "step": steps * ranks,
    }
    got = {p["name"]: p["all"]["count"] for p in doc["phases"]}  # type: ignore[attr-defined,index]
    for name, n in want.items():
        assert got[name] == n, (name, got[name], n)


def msprof(root: Path, timeout: float) -> tuple[float | None, int | None]:
    """Wall seconds of the real ``mstx_sum`` (None on timeout) and the ranges it counted."""
    exe = shutil.which("msprof-analyze")
    if exe is None:
        raise SystemExit("msprof-analyze is not installed (pip install msprof-analyze==26.2.0)")
    out = Path(tempfile.mkdtemp(prefix="msprof_out_"))
    cmd = [exe, "cluster", "-m", "mstx_sum", "-d", str(root), "-o", str(out), "--force"]
    wall, _, done = measure(cmd, timeout)
    if done is None:
        return None, None
    result = out / "cluster_analysis_output" / "cluster_analysis.db"
    if not result.is_file():  # its exit code is 0 even on failure: the output file says
        raise SystemExit(f"msprof-analyze wrote no {result}: {done.stdout[-2000:]}")
    with closing(sqlite3.connect(result)) as db:
        (rows,) = db.execute("SELECT COUNT(*) FROM MSTXMarkStats").fetchone()
    return wall, int(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--small-ranks", type=int, default=8, help="for the memory ratio")
    parser.add_argument("--vs-ranks", type=int, default=8, help="side by side with msprof-analyze")
    parser.add_argument("--vs-events", type=int, default=10_000)
    parser.add_argument("--msprof-timeout", type=float, default=600)
    parser.add_argument(
        "--work", default=str(Path(tempfile.gettempdir()) / "mstx_marks_summary_scale")
    )
    parser.add_argument(
        "--quick", action="store_true", help="8 and 2 ranks x 1e4, 2 x 2000 vs msprof"
    )
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.events, args.small_ranks = 8, 10_000, 2
        args.vs_ranks, args.vs_events = 2, 2000
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"cpus: {os.cpu_count()}; clusters under {work}")

    big = cluster(work, args.ranks, args.events)
    small = cluster(work, args.small_ranks, args.events)
    wall_small, peak_small, doc_small = ours(small)
    check_counts(doc_small, args.small_ranks, args.events)
    wall_big, peak_big, doc_big = ours(big)
    check_counts(doc_big, args.ranks, args.events)
    print(
        f"  ours, {args.small_ranks} ranks: {wall_small:.1f} s, peak {peak_small / 2**20:.0f} MiB"
    )
    print(f"  ours, {args.ranks} ranks: {wall_big:.1f} s, peak {peak_big / 2**20:.0f} MiB")

    vs = cluster(work, args.vs_ranks, args.vs_events)
    wall_vs, _, doc_vs = ours(vs)
    check_counts(doc_vs, args.vs_ranks, args.vs_events)
    ms_wall, ms_rows = msprof(vs, args.msprof_timeout)
    ranges = args.vs_ranks * (args.vs_events // PER_STEP) * PER_STEP
    if ms_wall is None:
        limit = args.msprof_timeout
        ratio = f"> {limit / wall_vs:.0f}x (msprof-analyze timed out after {limit:.0f} s)"
    else:
        ratio = f"{ms_wall / wall_vs:.1f}x ({ms_wall:.1f} s vs {wall_vs:.1f} s)"
        print(f"  msprof-analyze counted {ms_rows} ranges, ours {ranges}")
    print()
    print(f"{args.ranks} ranks x {args.events} events: {wall_big:.1f} s (target <= 30 s)")
    memory = peak_big / peak_small
    sizes = f"{args.ranks} ranks / {args.small_ranks} ranks"
    print(f"peak memory {sizes}: {memory:.2f}x (target <= 1.5x)")
    vs_size = f"{args.vs_ranks} ranks x {args.vs_events} events"
    print(f"msprof-analyze mstx_sum / ours on {vs_size}: {ratio}")


if __name__ == "__main__":
    main()
