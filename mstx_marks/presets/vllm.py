"""vLLM's and vllm-ascend's presets: one range per engine step, and the model's forward pass.

With vLLM's default V1 multiprocessing the front end (``LLM``, ``AsyncLLM``) only queues requests:
the engine runs in a spawned EngineCore process, and the model in a worker process (on CPU and
multi-device runs) or in the EngineCore process. The preset therefore patches (checked in vLLM
0.11 to 0.33; 0.32's CPU build run here):

- ``vllm.v1.engine.core:EngineCore.step``: ``vllm_one_step`` (domain ``vllm_one_step``), once
  per engine step that runs the model (an idle poll returns at once, and the clean-up step after
  the last request finished schedules no token: neither is a step);
- ``vllm.v1.worker.gpu_worker:Worker.execute_model`` (``CPUWorker`` inherits it):
  ``prefill_batch``, ``decode_batch`` or ``mixed_batch`` (domain ``vllm``) by the step's batch,
  with vLLM's own rule (``vllm/v1/utils.py`` ``compute_iteration_details``: a request is in its
  context phase when it is new or has no output token yet); and ``Worker.sample_tokens`` as
  ``sampling``;
- vllm-ascend's ``NPUWorker.execute_model`` (``vllm_ascend/worker/worker_v1.py`` in 0.11,
  ``worker.py`` from 0.13) and ``sample_tokens`` (0.13+), the same way.

The front end's ``LLMEngine.step`` is not patched: it times the queue, not the model.

>>> class Cached:
...     def is_context_phase(self, req_id): return False
>>> class Out:
...     total_num_scheduled_tokens = 2
...     num_scheduled_tokens = {"a": 1, "b": 1}
...     scheduled_new_reqs = []
...     scheduled_cached_reqs = Cached()
>>> batch_kind(Out())
'decode_batch'
"""

from __future__ import annotations

from typing import Any

from . import Target, named_per_call

__all__ = ["TARGETS", "batch_kind"]

_KINDS = ("prefill_batch", "decode_batch", "mixed_batch")


def batch_kind(scheduler_output: Any) -> str | None:
    """``prefill_batch``, ``decode_batch`` or ``mixed_batch`` for one step's ``SchedulerOutput``;
    None for an empty step (no token scheduled). Unknown shapes count as mixed."""
    try:
        if scheduler_output.total_num_scheduled_tokens == 0:
            return None
        new = {r.req_id for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        context = generation = 0
        for req_id in scheduler_output.num_scheduled_tokens:
            if req_id in new or cached.is_context_phase(req_id):
                context += 1
            else:
                generation += 1
    except Exception:  # another vLLM's SchedulerOutput: still one range per step
        return "mixed_batch"
    if context and generation:
        return "mixed_batch"
    return "prefill_batch" if context else "decode_batch"


def _has_work(scheduler: Any) -> bool:
    """Whether this engine step will run the model: some request is unfinished.

    Not ``has_requests()``, which is also True for the clean-up step after the last request
    finished (it schedules 0 tokens, and ``step`` returns ``model_executed=False``): that step
    would be a ``vllm_one_step`` range with no forward pass in the worker, one more per
    ``generate`` than there are model steps, and it would count in a sampling window."""
    unfinished = getattr(scheduler, "has_unfinished_requests", None)
    if unfinished is None:  # a scheduler without it: every step with requests is one
        return bool(scheduler.has_requests())
    return bool(unfinished())


def _step_name(engine: Any, arg: Any) -> str | None:
    try:
        return "vllm_one_step" if _has_work(engine.scheduler) else None
    except Exception:  # another vLLM's scheduler: every step is one
        return "vllm_one_step"


#: ``EngineCore.step`` as one range per model step: the idle polls that find no request, and the
#: clean-up step after the last request finished (0 tokens scheduled), are not marked and do not
#: count for sampling.
engine_step = named_per_call(_step_name, ("vllm_one_step",))
#: A worker's ``execute_model(scheduler_output)`` as a range named by the batch kind.
execute_model = named_per_call(lambda worker, out: batch_kind(out), _KINDS)


_CORE = "vllm.v1.engine.core"
_GPU_WORKER = "vllm.v1.worker.gpu_worker"
_ALL = "vLLM 0.11 to 0.33"

TARGETS: tuple[Target, ...] = (
    Target("vllm", _CORE, "EngineCore.step", "vllm_one_step", _ALL, engine_step, "vllm_one_step"),
    Target("vllm", _GPU_WORKER, "Worker.execute_model", "prefill_batch", _ALL, execute_model,
           "vllm"),
    Target("vllm", _GPU_WORKER, "Worker.sample_tokens", "sampling", "vLLM 0.12 and newer",
           domain="vllm"),
    Target("vllm_ascend", "vllm_ascend.worker.worker_v1", "NPUWorker.execute_model",
           "prefill_batch", "vllm-ascend 0.11", execute_model, "vllm"),
    Target("vllm_ascend", "vllm_ascend.worker.worker", "NPUWorker.execute_model",
           "prefill_batch", "vllm-ascend 0.13 and newer", execute_model, "vllm"),
    Target("vllm_ascend", "vllm_ascend.worker.worker", "NPUWorker.sample_tokens", "sampling",
           "vllm-ascend 0.13 and newer", domain="vllm"),
)  # fmt: skip
