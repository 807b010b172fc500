"""Tokens per second of real vLLM (CPU build) with the vllm preset on vs off, side by side.

Four engines stay up at once: two plain, two started with ``MSTX_MARKS_INSTRUMENT=vllm`` and
``MSTX_MARKS_OUT`` (so every engine step and forward is a recorded range, the heaviest CPU path
the library has), started in both orders: with one engine of each, the one started first ran
1.3-1.5x slower in every round here (each engine binds its threads to the same cores), so start
order must cancel out too. Rounds alternate between them, in
shuffled order, and the result is the median of the per-round ratios, so drift cancels out::

    python3 benchmarks/vllm_throughput.py [--rounds 7] [--prompts 32] [--tokens 64] [--json F]

It builds (or reuses) the cached vLLM venv of the real-engine tests and a tiny random Llama.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))

from engine_venvs import engine_venv, install_self  # noqa: E402

# Runs inside the venv: one LLM, then "run" lines on stdin -> one JSON result line each.
SERVER = r"""
import json, os, sys, time
sys.path.insert(0, os.environ["TINY_LLM_DIR"])
from pathlib import Path
from tiny_llm import build_tiny_llama
folder = build_tiny_llama(Path(os.environ["TINY_LLAMA"]))
from vllm import LLM, SamplingParams
llm = LLM(model=str(folder), dtype="float32", max_model_len=256, enforce_eager=True, seed=0)
n, tokens = int(sys.argv[1]), int(sys.argv[2])
prompts = [f"Once upon a time number {i}" for i in range(n)]
params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
llm.generate(prompts[:2], params)  # warm-up
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t
    ids = [list(o.outputs[0].token_ids) for o in outs]
    print(json.dumps({"tokens": sum(map(len, ids)), "seconds": dt, "ids": ids}), flush=True)
"""


def _start(
    python: Path, env: dict[str, str], prompts: int, tokens: int, cwd: Path
) -> subprocess.Popen[str]:
    # Not from the repository: its mstx_marks.egg-info (the editable install's metadata) would
    # be found first on sys.path and shadow the venv's own, entry points included.
    proc = subprocess.Popen(
        [str(python), "-c", SERVER, str(prompts), str(tokens)],
        env=env,
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # vLLM logs to stderr; our lines are JSON on stdout
        if line.startswith("{") and json.loads(line).get("ready"):
            return proc
    raise RuntimeError(f"engine exited with {proc.wait()} before it was ready")


def _round(proc: subprocess.Popen[str]) -> dict[str, Any]:
    stdin: IO[str] = proc.stdin  # type: ignore[assignment]
    stdout: IO[str] = proc.stdout  # type: ignore[assignment]
    stdin.write("run\n")
    stdin.flush()
    result: dict[str, Any] = json.loads(stdout.readline())
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per round (default 32)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per prompt (default 64)")
    ap.add_argument("--json", metavar="FILE", help="also write the raw figures as JSON")
    args = ap.parse_args()

    python = engine_venv("vllm")
    install_self(python)
    work = Path(tempfile.mkdtemp(prefix="mstx_marks_vllm_bench_"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    base.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        TINY_LLAMA=str(work / "tiny-llama"),
        TINY_LLM_DIR=str(REPO / "tests" / "support"),
    )
    marked_env = dict(base, MSTX_MARKS_INSTRUMENT="vllm", MSTX_MARKS_OUT=str(work / "out"))
    started = [("plain", base), ("instrumented", marked_env)]
    started += list(reversed(started))
    engines = {
        f"{name} {i // 2}": _start(python, env, args.prompts, args.tokens, work)
        for i, (name, env) in enumerate(started)
    }
    rows: list[dict[str, float]] = []
    same_tokens = True
    try:
        for _ in range(args.rounds):
            order = list(engines)
            random.shuffle(order)
            got = {name: _round(engines[name]) for name in order}
            same_tokens &= len({json.dumps(r["ids"]) for r in got.values()}) == 1
            rate = {n: r["tokens"] / r["seconds"] for n, r in got.items()}
            rows.append(
                {
                    kind: statistics.mean(v for n, v in rate.items() if n.startswith(kind))
                    for kind in ("plain", "instrumented")
                }
            )
    finally:
        for proc in engines.values():
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait(timeout=120)
    ratio = statistics.median(r["instrumented"] / r["plain"] for r in rows)
    plain = statistics.median(r["plain"] for r in rows)
    marked = statistics.median(r["instrumented"] for r in rows)
    print(f"vLLM {args.prompts} prompts x {args.tokens} tokens, {args.rounds} alternating rounds")
    print(f"plain          {plain:8.0f} tokens/s (median)")
    print(f"instrumented   {marked:8.0f} tokens/s (median)")
    print(f"ratio          {ratio:8.3f}  (median of per-round instrumented/plain)")
    print(f"same tokens    {same_tokens}")
    spills = list((work / "out" / "spill").glob("*.jsonl"))
    print(f"spill files    {len(spills)} (engine-core and worker processes)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rows, "ratio": ratio}, indent=1))
    return 0 if same_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
