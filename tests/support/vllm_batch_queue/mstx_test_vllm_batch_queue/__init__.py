"""Test support: make vLLM's EngineCore keep a batch queue on CPU, and count what it ran.

vLLM's EngineCore runs ``step_with_batch_queue`` instead of ``step`` when
``max_concurrent_batches > 1`` (async scheduling, or pipeline parallel > 1). Its CPU platform
turns async scheduling off, and true async scheduling needs CUDA events in the GPU runner. So,
as pipeline parallelism does, this keeps the ordinary (sync) scheduler and only makes
``VllmConfig.max_concurrent_batches`` (vLLM 0.12+; the executor's property in 0.11) say 2: the
engine builds a batch queue of 2, and a batch may be scheduled while the one before it is still
running in the worker (the mp executor's futures resolve when read).

It does nothing unless ``MSTX_TEST_BATCH_QUEUE_OUT`` names a folder. Then the process that runs
the engine writes ``<folder>/<pid>.json`` after each engine call, with the number of
``step_with_batch_queue`` and ``step`` calls, the batches processed with tokens (by
``Scheduler.update_from_output``), their kinds by vLLM's own ``compute_iteration_details``, and
the most batches with tokens ever queued at once.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

ENV = "MSTX_TEST_BATCH_QUEUE_OUT"

_done = False
_counts: dict[str, Any] = {
    "step_with_batch_queue": 0,
    "step": 0,
    "batches": 0,
    "kinds": [],
    "max_in_flight": 0,
}


def _write() -> None:
    out = os.environ[ENV]
    path = os.path.join(out, f"{os.getpid()}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_counts, f)
    os.replace(tmp, path)


def _kind(scheduler_output: Any) -> str:
    from vllm.v1.utils import compute_iteration_details

    details = compute_iteration_details(scheduler_output)
    if details.num_ctx_requests and details.num_generation_requests:
        return "mixed_batch"
    return "prefill_batch" if details.num_ctx_requests else "decode_batch"


def _tokens(scheduler_output: Any) -> int:
    return int(scheduler_output.total_num_scheduled_tokens)


def force_batch_queue() -> None:
    global _done
    if _done or not os.environ.get(ENV):
        return
    _done = True
    two = property(lambda self: 2)
    try:  # vLLM 0.12+: the config decides (EngineCore.__init__ reads it)
        from vllm.config.vllm import VllmConfig

        if isinstance(vars(VllmConfig).get("max_concurrent_batches"), property):
            VllmConfig.max_concurrent_batches = two
    except ImportError:
        pass
    try:  # vLLM 0.11: the executor decides
        from vllm.executor.uniproc_executor import UniProcExecutor
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        UniProcExecutor.max_concurrent_batches = two
        MultiprocExecutor.max_concurrent_batches = two
    except ImportError:
        pass

    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    queue_step = EngineCore.step_with_batch_queue
    plain_step = EngineCore.step
    update = Scheduler.update_from_output

    @functools.wraps(queue_step)
    def step_with_batch_queue(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return queue_step(self, *args, **kwargs)
        finally:
            _counts["step_with_batch_queue"] += 1
            in_flight = sum(1 for entry in self.batch_queue or () if _tokens(entry[1]) > 0)
            _counts["max_in_flight"] = max(_counts["max_in_flight"], in_flight)
            _write()

    @functools.wraps(plain_step)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return plain_step(self, *args, **kwargs)
        finally:
            _counts["step"] += 1
            _write()

    @functools.wraps(update)
    def update_from_output(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if _tokens(scheduler_output) > 0:
            _counts["batches"] += 1
            _counts["kinds"].append(_kind(scheduler_output))
        return update(self, scheduler_output, *args, **kwargs)

    EngineCore.step_with_batch_queue = step_with_batch_queue
    EngineCore.step = step
    Scheduler.update_from_output = update_from_output
