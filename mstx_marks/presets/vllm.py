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

Two more presets, named on their own in ``MSTX_MARKS_INSTRUMENT`` (both apply to vllm-ascend too,
which runs vLLM's own EngineCore):

- ``vllm_dp``: msprof-analyze's ``dp_analysis`` (its ``pre-research`` branch) reads, per engine
  step, a range in domain ``step_process`` on the current stream (``connectionId`` not
  4294967295) and a ``marker`` in that domain whose message is JSON with ``running_reqs``,
  ``waiting_reqs``, ``gpu_cache_usage`` and ``out_tokens``, matched to the ranges by order. So
  each ``EngineCore.step`` that runs the model is a ``step`` range, and just before it ends a mark
  of :func:`dp_message` of the scheduler's state after the step (``len(scheduler.running)``,
  ``len(scheduler.waiting)``, ``kv_cache_manager.usage``, and the new tokens in the step's
  outputs). It wraps over the ``vllm`` preset's own wrapper when both are on.
- ``vllm_modules``: the model runner's model, hooked by
  :func:`mstx_marks.modules.instrument_modules` (depth 4: the model, its decoder layers,
  their attention and MLP) after
  ``GPUModelRunner.load_model`` / ``CPUModelRunner.load_model`` / vllm-ascend's
  ``NPUModelRunner.load_model``. Modules inside a ``torch.compile``d region (vLLM compiles the
  decoder stack unless ``enforce_eager``) get no range (``under_compile="skip"``), and neither
  does a step replayed from a CUDA/ACL graph: hooks do not run there.

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

import contextlib
import functools
import json
from typing import Any

from ..diagnostics import warn_once
from ..instrument import Instrumented, replace
from ..modules import hook_after
from ..names import MAX_NAME_BYTES
from ..ranges import Mark, _begin, _end, instant
from . import Options, Target, named_per_call

__all__ = ["DP_FIELDS", "TARGETS", "batch_kind", "dp_message"]

#: ``dp_analysis``'s marker fields, in the order kept when the message must be shortened.
DP_FIELDS = ("running_reqs", "waiting_reqs", "out_tokens", "gpu_cache_usage")

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


def dp_message(stats: dict[str, Any]) -> str:
    """The marker text ``dp_analysis`` parses: compact JSON of ``stats``' :data:`DP_FIELDS`.
    Over MSTX's 156 bytes, fields are dropped from the end (never cut mid-JSON), saying so once.

    >>> dp_message({"running_reqs": 2, "waiting_reqs": 0, "gpu_cache_usage": 0.25, "out_tokens": 2})
    '{"running_reqs":2,"waiting_reqs":0,"out_tokens":2,"gpu_cache_usage":0.25}'
    """
    fields = {k: stats[k] for k in DP_FIELDS if k in stats}
    while True:
        text = json.dumps(fields, separators=(",", ":"))
        if len(text.encode()) <= MAX_NAME_BYTES or not fields:
            break
        dropped = list(fields)[-1]
        del fields[dropped]
        warn_once(
            ("dp message",),
            f"vllm_dp: the step marker is over MSTX's {MAX_NAME_BYTES} bytes; {dropped!r} (and"
            " any later field) dropped from it (said once)",
        )
    return text


def _step_stats(engine: Any, outputs: Any) -> dict[str, Any]:
    """The scheduler's queues after the step, as vLLM's own ``SchedulerStats`` count them (made
    once the step's outputs are in): a request that finished in this step is not running."""
    scheduler = engine.scheduler
    stats: dict[str, Any] = {}
    # Each field on its own: another vLLM's scheduler may lack one; the marker keeps the rest.
    with contextlib.suppress(Exception):
        stats["running_reqs"] = len(scheduler.running)
    with contextlib.suppress(Exception):
        stats["waiting_reqs"] = len(scheduler.waiting)
    with contextlib.suppress(Exception):
        stats["gpu_cache_usage"] = round(float(scheduler.kv_cache_manager.usage), 4)
    with contextlib.suppress(Exception):
        result = outputs[0] if isinstance(outputs, tuple) else outputs
        stats["out_tokens"] = sum(
            len(o.new_token_ids) for eco in result.values() for o in eco.outputs
        )
    return stats


def dp_step(owner: Any, attr: str, target: Target, options: Options) -> Instrumented:
    """``EngineCore.step`` as ``dp_analysis`` reads it (module docstring): a ``step`` range on the
    current stream, and a stats marker before it ends; idle steps are neither."""
    site = Mark(target.phase, domain=target.domain, stream="current")
    policy = options.policy(target.phase)  # MSTX_MARKS_SAMPLE="vllm_one_step=...": both ranges
    decide = None if policy is None else policy.decisions()

    def wrap(o: object, a: str, raw: Any) -> Any:
        @functools.wraps(raw)
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _step_name(self, None) is None or (decide is not None and not next(decide)):
                return raw(self, *args, **kwargs)
            end, handle = _begin(None, site._gate, site.name, site.domain)
            try:
                out = raw(self, *args, **kwargs)
                try:
                    instant(dp_message(_step_stats(self, out)), domain=target.domain)
                except Exception as exc:
                    warn_once(("dp marker",), f"vllm_dp: no step marker ({exc})")
                return out
            finally:
                _end(end, handle, site.domain)

        return step

    return replace(owner, attr, wrap, again=True)


def _runner_model(runner: Any) -> Any:
    return getattr(runner, "model", None)


_CORE = "vllm.v1.engine.core"
_GPU_WORKER = "vllm.v1.worker.gpu_worker"
_ALL = "vLLM 0.11 to 0.33"
_MODEL = hook_after(_runner_model, depth=4)

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
    Target("vllm_dp", _CORE, "EngineCore.step", "vllm_one_step", _ALL, dp_step, "step_process"),
    Target("vllm_modules", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.load_model",
           "module_forward", _ALL, _MODEL),
    Target("vllm_modules", "vllm.v1.worker.cpu_model_runner", "CPUModelRunner.load_model",
           "module_forward", "vLLM 0.11 to 0.33, CPU build", _MODEL),
    Target("vllm_modules", "vllm_ascend.worker.model_runner_v1", "NPUModelRunner.load_model",
           "module_forward", "vllm-ascend 0.11 and newer", _MODEL),
)  # fmt: skip
