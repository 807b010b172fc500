"""Run inside the vllm venv: ``vllm.LLM(...).generate(...)`` on the tiny model, nothing else.

No mstx_marks import: whatever mstx_marks does here, it does from the environment (vLLM loads its
``vllm.general_plugins`` entry point in each of its processes). Writes, as JSON, this (front-end)
process's pid and, per ``generate`` call, its prompts, wall-clock bounds (``time.time_ns()``, the
recorder's clock) and the generated token ids.

usage: python vllm_generate.py MODEL_DIR RESULT_JSON
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(model: str, result: str) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        dtype="float32",  # bf16 picks AMX attention, which this CPU's VM refuses (SIGILL)
        max_model_len=256,
        enforce_eager=True,
        seed=0,
        max_num_seqs=16,
    )
    calls = [
        # A batch: its requests reach the engine one by one, so its step count varies.
        (["Hello world", "The quick brown fox"], SamplingParams(temperature=0, max_tokens=8)),
        # One request each, never stopping early: exactly 1 prefill + (max_tokens - 1) decodes.
        (["Once upon a time"], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)),
        (["Profilers mark ranges"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)),
    ]
    done = []
    for prompts, params in calls:
        begin = time.time_ns()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        end = time.time_ns()
        done.append(
            {
                "prompts": prompts,
                "max_tokens": params.max_tokens,
                "ignore_eos": params.ignore_eos,
                "begin_ns": begin,
                "end_ns": end,
                "prompt_token_ids": [list(o.prompt_token_ids or []) for o in outputs],
                "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            }
        )
    with open(result, "w") as f:
        json.dump({"pid": os.getpid(), "calls": done}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
