"""``python -m mstx_marks demo``: a small but real GRPO training loop on CPU, every phase marked.

N ranks run as separate processes joined by ``torch.distributed`` (gloo). Each step, every rank
generates answers with a tiny causal transformer (an autoregressive decode loop, one
``vllm_one_step`` range per token in a window), scores them, computes reference and old-policy
log-probs, group-normalised advantages, and updates the actor with a clipped policy-gradient loss,
a real backward pass and a gradient all-reduce. Ranges go through :func:`mstx_marks.mark` with the
registry's phases. With no NPU or GPU they are recorded (``backend="record"``); on an NPU they are
also emitted as MSTX, on CUDA as NVTX, and recorded too, so the output files always exist.

Before the ranks start together (a barrier), each one runs an unrecorded warm-up step on a
throwaway copy of the model: torch's lazy imports and first-call set-up (seconds, and not the
same on every rank) would otherwise land in step 1 of one rank and make a symmetric job look
unbalanced. Each rank prints a line when it is ready and one per step.

Under ``--out`` (default ``demo-out``) the demo writes ``trace.json`` (all ranks, for Perfetto),
``chrome/mstx_marks-rank<N>-<host>-<pid>.trace.json`` (the ranks' role is ``mstx_marks``),
``ascend/mstx_marks_<host>_<pid>_<time>_ascend_pt/...`` (for msprof-analyze), ``report.html``
(the HTML report) and ``timeline.svg``, then prints the summary table.

>>> run_demo  # doctest: +SKIP
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple, Optional

from mstx_marks.analysis.render.report_html import write_html_report
from mstx_marks.analysis.render.timeline import write_svg
from mstx_marks.analysis.summary import fold_name, format_table, load_traces, summarize
from mstx_marks.backends import detect
from mstx_marks.backends.noop import NoopBackend
from mstx_marks.base import env as mstx_env
from mstx_marks.core.configuration import configure
from mstx_marks.core.ranges import Mark
from mstx_marks.export import flush_at_exit, write_chrome_trace

__all__ = ["DemoOptions", "run_demo"]

_MARKER = ".mstx_marks_demo"
_OWNED = ("ascend", "chrome", "trace.json", "timeline.svg", "report.html")
_COLLECTIVE_TIMEOUT_S = 60
# A stopped rank blocked in a collective runs its SIGTERM handler (which writes its files) only
# once the collective times out; it is killed only if it is still there well after that.
_STOP_GRACE_S = _COLLECTIVE_TIMEOUT_S + 15


def _choose_backend() -> str:
    """The accelerator's backend when there is one (MSTX or NVTX), the in-process recorder
    beside it either way: flush_at_exit already asked for recording (``backends/tee.py``)."""
    configure(backend="auto", record=True)
    device = detect(probe=True)
    return "record" if isinstance(device, NoopBackend) else f"{device.name}+record"


def _say(line: str) -> None:
    # One write per line: the ranks share stdout, and print() writes the newline separately, so
    # two ranks' lines could interleave.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _unmarked(*args: object, **kwargs: object) -> AbstractContextManager[None]:
    """Stands in for :func:`mark` in the warm-up step, which must not be recorded."""
    return nullcontext()


def _worker(rank: int, world: int, steps: int, tokens: int, out: Path) -> None:
    started = time.perf_counter()
    # Without numpy (not a dependency: the demo never converts a tensor to an array), importing
    # torch warns "Failed to initialize NumPy: No module named 'numpy'" once per process. It is
    # noise here, so hide exactly that warning, for the import only.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Failed to initialize NumPy", UserWarning)
        import torch
        import torch.distributed as dist

        from mstx_marks.cli import demo_model

    flush = flush_at_exit(out, rank=rank)
    backend = _choose_backend()
    torch.set_num_threads(1)
    torch.manual_seed(1234)  # the same initial weights on every rank, as DDP would broadcast
    job = demo_model.Job(world=world, tokens=tokens)
    # The first optimizer built imports torch._dynamo: seconds, and not the same on every rank.
    opt = torch.optim.Adam(job.actor.parameters(), lr=3e-3)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=_COLLECTIVE_TIMEOUT_S)
    )
    job.warm_up(seed=10**6 + rank, span=_unmarked)
    dist.barrier()  # start the steps together: start-up and warm-up skew are not phases
    _say(
        f"[demo] rank {rank}: ready in {time.perf_counter() - started:.1f} s "
        f"(torch imported, model built, one warm-up step; backend {backend})"
    )
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        # Mark, not mark: a fresh definition per use, so each rollout's window counts its own
        # tokens (mark() would share one sampling counter per call site, across rollouts).
        reward, loss = job.grpo_step(job.actor, opt, gen, Mark)
        took = time.perf_counter() - t0
        mean_reward = reward.mean().clone()
        dist.all_reduce(mean_reward)
        _say(
            f"[demo] rank {rank}: step {step}/{steps} done in {took:.2f} s "
            f"(reward {mean_reward.item() / world:.3f}, loss {loss.item():+.4f})"
        )
    dist.destroy_process_group()
    flush()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prepare(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        if not (out / _MARKER).exists():
            raise SystemExit(
                f"error: {out} is not empty and not a demo output; choose another --out"
            )
        for name in _OWNED:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / _MARKER).write_text("written by python -m mstx_marks demo\n")


class DemoOptions(NamedTuple):
    """What ``mstx-marks demo`` was asked for (its options are declared in :mod:`.cli`)."""

    ranks: int = 2
    steps: int = 4
    tokens: int = 16
    out: str = "demo-out"
    timeout: float = 300
    worker: Optional[int] = None


def _run_ranks(args: DemoOptions, out: Path) -> int:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    env.setdefault(mstx_env.RUN, mstx_env.run_id())  # the ranks are one run of one job
    env["WORLD_SIZE"] = str(args.ranks)
    procs = []
    for rank in range(args.ranks):
        cmd = [sys.executable, "-m", "mstx_marks", "demo", "--worker", str(rank)]
        cmd += ["--ranks", str(args.ranks), "--steps", str(args.steps)]
        cmd += ["--tokens", str(args.tokens), "--out", str(out)]
        procs.append(subprocess.Popen(cmd, env=dict(env, RANK=str(rank))))
    deadline = time.monotonic() + args.timeout
    # Poll every rank each round (not any(), which stops at the first one still running): the
    # others wait in a collective for a rank that died, so only its exit code shows the failure.
    while None in [p.poll() for p in procs]:
        failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
        if failed or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.terminate()  # SIGTERM: the worker still writes what it recorded
            for p in procs:
                try:
                    p.wait(timeout=_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            why = f"rank {failed[0]} failed" if failed else f"timed out after {args.timeout} s"
            print(f"error: demo {why}; see the output above", file=sys.stderr)
            return 1
        time.sleep(0.05)
    failed = [r for r, p in enumerate(procs) if p.returncode]
    if failed:
        code = procs[failed[0]].returncode
        print(f"error: demo rank {failed[0]} exited with code {code}", file=sys.stderr)
        return 1
    return 0


def run_demo(args: DemoOptions) -> int:
    """Run the demo (or, with ``worker``, one of its ranks); returns the exit code."""
    if args.ranks < 1 or args.steps < 1 or args.tokens < 2:
        raise ValueError("--ranks and --steps must be >= 1 and --tokens >= 2")
    out = Path(args.out)
    if args.worker is not None:
        _worker(args.worker, args.ranks, args.steps, args.tokens, out)
        # Everything is written. Leave without the interpreter's teardown of torch, which takes
        # about a second per rank and does nothing this process needs (flush_at_exit's exit hook
        # would only write the same files again).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    # Only looked up, not imported: importing torch takes seconds, and each worker imports it.
    if importlib.util.find_spec("torch") is None:
        print("error: the demo needs torch: pip install torch", file=sys.stderr)
        return 1
    _prepare(out)
    started = time.perf_counter()
    print(
        f"[demo] {args.ranks} ranks x {args.steps} steps on CPU (gloo), writing {out}/", flush=True
    )
    code = _run_ranks(args, out)
    if code:
        return code
    traces, errors, _ = load_traces(out / "ascend")
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if errors or len(traces) != args.ranks:
        print(
            f"error: expected {args.ranks} rank databases under {out / 'ascend'}", file=sys.stderr
        )
        return 1
    write_chrome_trace(out / "trace.json", traces)
    summary = summarize(traces)
    write_svg(out / "timeline.svg", traces, fold_name, model=summary.per_step)  # one model
    write_html_report(out / "report.html", traces, summary)
    print(format_table(summary))
    print(f"\n[demo] done in {time.perf_counter() - started:.1f} s. Wrote:")
    print(f"  {out / 'trace.json'}  (all ranks: open in https://ui.perfetto.dev)")
    print(f"  {out / 'report.html'}  (timeline, phase table, rank imbalance: open in a browser)")
    print(f"  {out / 'timeline.svg'}  (the timeline as a picture)")
    print(f"  {out / 'ascend'}/  (msprof-analyze cluster -m mstx_sum -d {out / 'ascend'})")
    print(f"  {out / 'chrome'}/  (one Chrome trace per rank)")
    print(f"  python -m mstx_marks summary {out}  (this table again)")
    print("    --csv | --json          the table as data")
    print("    --svg FILE              the timeline as a picture")
    print("    --html FILE             the HTML report")
    print("    --trace FILE            the whole job as one Perfetto trace")
    return 0
