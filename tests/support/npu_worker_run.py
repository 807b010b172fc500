"""vllm-ascend's real NPU worker driven through real vLLM objects on a CPU machine; writes what
mstx_marks recorded as JSON (to the file named, or stdout for ``-``).

Run with the python of a ``vllm-ascend-*`` engine venv (``tests/support/npu_venvs.py``; this
repository installed into it), with ``MSTX_MARKS_INSTRUMENT`` set as a job would set it::

    MSTX_MARKS_INSTRUMENT=verl,vllm <venv>/bin/python tests/support/npu_worker_run.py result.json

What is real: vLLM's and vllm-ascend's code as published (``EngineArgs.create_engine_config``,
with vllm-ascend's ``NPUPlatform`` as the current platform, picks the worker class;
``WorkerWrapperBase.init_worker`` loads the ``vllm.general_plugins`` (vllm-ascend's own patches
and mstx_marks' activation) and builds the worker, running ``NPUWorker.__init__`` and vLLM's
``WorkerBase.__init__``); vLLM's process groups (world size 1, gloo); the ``SchedulerOutput``,
``NewRequestData``, ``CachedRequestData`` and ``GrammarOutput`` objects of that vLLM release, and
the worker's own ``execute_model`` / ``sample_tokens``.

What is a stand-in (no NPU, no CANN):

- ``torch_npu`` and the other Ascend-only packages (``npu_stubs.py``), and ``torchvision``, which
  PyPI has no CPU build of;
- the worker's ``model_runner``: vllm-ascend builds its ``NPUModelRunner`` in ``init_device``,
  which needs a device, so :class:`StandInRunner` takes its place; its ``execute_model`` and
  ``sample_tokens`` return at once, and it keeps ``requests`` (req_id -> prompt length) as the
  real runner's ``_update_states`` does, which the preset reads on vLLM 0.11;
- the model: only a ``config.json`` (a 2-layer Llama), enough for vLLM's ``ModelConfig``; no
  weights are loaded.

With ``--worker base`` the worker class is instead ``BaseDerivedWorker`` (below), a class
deriving vLLM's ``WorkerBase`` directly, as a third-party worker would; it is built the same way.
Range collection: ``MSTX_MARKS_BACKEND=record`` (set here unless given), read from the default
recorder.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import traceback
import types
import warnings
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import npu_stubs

#: The tiny model's ``config.json`` (a 2-layer Llama; the same shape as ``tiny_llm.py``'s).
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 512,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
BLOCK_SIZE = 128


class StandInRunner:
    """Stands in for ``NPUModelRunner``: returns at once. ``requests`` follows the scheduler's
    outputs as the real runner's ``_update_states`` does (new requests added, finished ones
    dropped), holding what the preset reads there (``num_prompt_tokens``)."""

    def __init__(self, returns_in_sample: bool) -> None:
        self.requests: dict[str, Any] = {}
        self.calls: list[str] = []
        self._returns_in_sample = returns_in_sample

    def execute_model(self, scheduler_output: Any, intermediate_tensors: Any = None) -> Any:
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

        self.calls.append("execute_model")
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            self.requests[new.req_id] = types.SimpleNamespace(
                num_prompt_tokens=len(new.prompt_token_ids)
            )
        if not scheduler_output.total_num_scheduled_tokens:  # no forward pass, no sampling
            return EMPTY_MODEL_RUNNER_OUTPUT
        # vLLM 0.12+: execute_model returns None and sample_tokens gives the output.
        return None if self._returns_in_sample else EMPTY_MODEL_RUNNER_OUTPUT

    def sample_tokens(self, grammar_output: Any) -> Any:
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

        self.calls.append("sample_tokens")
        return EMPTY_MODEL_RUNNER_OUTPUT


def _base_derived_worker_class() -> type:
    from vllm.v1.worker.worker_base import WorkerBase

    class BaseDerivedWorker(WorkerBase):  # type: ignore[misc,unused-ignore]
        """A worker deriving vLLM's ``WorkerBase`` directly (neither ``Worker`` nor
        ``NPUWorker``), as an out-of-tree platform's would; no preset names it."""

        def execute_model(self, scheduler_output: Any) -> Any:
            return self.model_runner.execute_model(scheduler_output, None)

    if hasattr(WorkerBase, "sample_tokens"):  # vLLM 0.12+

        def sample_tokens(self: Any, grammar_output: Any) -> Any:
            return self.model_runner.sample_tokens(grammar_output)

        BaseDerivedWorker.sample_tokens = sample_tokens  # type: ignore[attr-defined,unused-ignore]
    BaseDerivedWorker.__module__ = __name__
    BaseDerivedWorker.__qualname__ = "BaseDerivedWorker"
    return BaseDerivedWorker


def __getattr__(name: str) -> Any:
    """``BaseDerivedWorker``, made on first use (vLLM must be importable first): vLLM resolves
    ``worker_cls`` by qualified name, as ``<this module>.BaseDerivedWorker``."""
    if name == "BaseDerivedWorker":
        cls = _base_derived_worker_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


# --- real vLLM objects ---------------------------------------------------------------------


def _make(cls: type, **candidates: Any) -> Any:
    """``cls(...)`` with those ``candidates`` that are fields of this vLLM release's ``cls``;
    a required field not among them is an error (the release changed: say so)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    missing = [
        name
        for name, f in fields.items()
        if name not in candidates
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise TypeError(f"{cls.__qualname__}: no value for required fields {missing}")
    return cls(**{k: v for k, v in candidates.items() if k in fields})


@dataclasses.dataclass
class Req:
    """A request of the scenario: its prompt length, and what the engine has done so far."""

    req_id: str
    prompt: int
    computed: int = 0
    output: int = 0


def _new(req: Req, tokens: int) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import NewRequestData

    return _make(
        NewRequestData,
        req_id=req.req_id,
        prompt_token_ids=list(range(3, 3 + req.prompt)),
        mm_features=[],
        sampling_params=SamplingParams(max_tokens=8),
        pooling_params=None,
        block_ids=([0],),
        num_computed_tokens=req.computed,
        lora_request=None,
    )


def _cached(reqs: list[Req]) -> Any:
    from vllm.v1.core.sched.output import CachedRequestData

    return _make(
        CachedRequestData,
        req_ids=[r.req_id for r in reqs],
        resumed_from_preemption=[False for _ in reqs],  # vLLM 0.11
        resumed_req_ids=set(),  # vLLM 0.12+
        new_token_ids=[[] for _ in reqs],
        all_token_ids={},
        new_block_ids=[None for _ in reqs],
        num_computed_tokens=[r.computed for r in reqs],
        num_output_tokens=[r.output for r in reqs],  # vLLM 0.12+
    )


def _scheduler_output(
    new: list[tuple[Req, int]], cached: list[tuple[Req, int]], finished: set[str]
) -> Any:
    """One step's real ``SchedulerOutput``: ``new`` and ``cached`` as (request, tokens)."""
    from vllm.v1.core.sched.output import SchedulerOutput

    scheduled = {r.req_id: n for r, n in [*new, *cached]}
    out = _make(
        SchedulerOutput,
        scheduled_new_reqs=[_new(r, n) for r, n in new],
        scheduled_cached_reqs=_cached([r for r, _ in cached]),
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        num_common_prefix_blocks=[0],
        finished_req_ids=set(finished),
        free_encoder_mm_hashes=[],
        structured_output_request_ids={},  # vLLM 0.11
        grammar_bitmask=None,  # vLLM 0.11
    )
    # What the engine does after the step: tokens computed; a request whose prompt is done
    # gets one output token.
    for req, n in [*new, *cached]:
        req.computed += n
        if req.computed >= req.prompt:
            req.output += 1
    return out


def scenario() -> list[tuple[str, Any]]:
    """The steps, each named by the batch kind it is: a prefill of two new requests, their
    decode, a mixed step (one decodes while a third request's prompt starts, chunked), that
    prompt's second chunk alone (a chunked prefill), its decode, and an empty step."""
    a, b, c = Req("a", 8), Req("b", 6), Req("c", 20)
    steps: list[tuple[str, list[tuple[Req, int]], list[tuple[Req, int]], set[str]]] = [
        ("prefill", [(a, 8), (b, 6)], [], set())
    ]
    steps.append(("decode", [], [(a, 1), (b, 1)], set()))
    steps.append(("mixed", [(c, 8)], [(a, 1)], {"b"}))
    steps.append(("chunked_prefill", [], [(c, 12)], {"a"}))
    steps.append(("decode", [], [(c, 1)], set()))
    steps.append(("empty", [], [], {"c"}))
    return [
        (label, _scheduler_output(new, cached, finished)) for label, new, cached, finished in steps
    ]


def _vllm_kind(scheduler_output: Any) -> Optional[str]:
    """vLLM's own verdict (``compute_iteration_details``, vLLM 0.12+), None where it has none."""
    try:
        from vllm.v1.utils import compute_iteration_details
    except ImportError:
        return None
    details = compute_iteration_details(scheduler_output)
    context = details.num_ctx_requests
    generation = details.num_generation_requests
    if not context and not generation:
        return "empty"
    if context and generation:
        return "mixed_batch"
    return "prefill_batch" if context else "decode_batch"


def _grammar_output() -> Any:
    import numpy as np
    from vllm.v1.core.sched.output import GrammarOutput

    return _make(
        GrammarOutput,
        structured_output_request_ids=[],
        grammar_bitmask=np.zeros((0, 1), dtype=np.int32),
    )


# --- the worker, as vLLM builds it -----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _engine_config(model: Path, worker_cls: str) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(model),
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=256,
        block_size=BLOCK_SIZE,
        worker_cls=worker_cls,
        distributed_executor_backend="mp",
    )
    return args.create_engine_config()


def _init_process_groups(vllm_config: Any, init_method: str) -> None:
    """vLLM's process groups for one rank on gloo: what NPU worker's ``init_device`` sets up on
    HCCL (``_init_worker_distributed_environment``), minus the device."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=1, rank=0, distributed_init_method=init_method, local_rank=0,
            backend="gloo",
        )  # fmt: skip
        ensure_model_parallel_initialized(1, 1)


def _covered(cls: Any, name: str) -> Optional[bool]:
    from mstx_marks.capture.presets.target import covered

    stored = vars(cls).get(name)
    return None if stored is None else covered(stored)


def _innermost_module(func: Any) -> Optional[str]:
    """The module of the function at the end of ``func``'s ``__wrapped__`` chain: whose code
    the method runs (vLLM's own, or a vllm-ascend patch's)."""
    for _ in range(10):
        inner = getattr(func, "__wrapped__", None)
        if inner is None:
            break
        func = inner
    return getattr(func, "__module__", None)


def imports(line_modules: list[str]) -> dict[str, Any]:
    """Import the worker modules (torch_npu stubbed) and say which loaded."""
    loaded = {}
    for name in line_modules:
        try:
            importlib.import_module(name)
            loaded[name] = "ok"
        except Exception as exc:
            loaded[name] = f"{type(exc).__name__}: {exc}"
    return {"imports": loaded}


def run(which: str, activation: str, builds: int, folder: Path) -> dict[str, Any]:
    if activation == "startup":
        import mstx_marks

        # As the launcher's start-up hook does (or Ray's worker_process_setup_hook): before
        # vLLM is imported. With "plugin", vLLM's own load_general_plugins() does it (in
        # EngineArgs and in WorkerWrapperBase.init_worker), after vLLM's modules are loaded.
        mstx_marks.activate()

    import vllm
    from vllm.platforms import current_platform

    from mstx_marks import default_recorder

    result: dict[str, Any] = {
        "vllm": vllm.__version__,
        "platform": f"{type(current_platform).__module__}.{type(current_platform).__qualname__}",
    }
    try:
        from importlib.metadata import version

        result["vllm_ascend"] = version("vllm_ascend")
    except Exception:
        result["vllm_ascend"] = None

    model = folder / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    asked = "auto" if which == "npu" else f"{__name__}.BaseDerivedWorker"
    if which == "base":  # vLLM resolves it by name: this script's module must be importable
        sys.modules.setdefault(__name__, sys.modules["__main__"])
    vllm_config = _engine_config(model, asked)
    worker_cls = vllm_config.parallel_config.worker_cls
    result["worker_cls"] = worker_cls

    from vllm.v1.worker import worker_base

    # vLLM 0.12+: beside WorkerBase; vLLM 0.11: in the V0 module (whose WorkerBase the v1 one
    # derives from).
    wrapper_cls: Any = getattr(worker_base, "WorkerWrapperBase", None)
    if wrapper_cls is None:
        wrapper_cls = importlib.import_module("vllm.worker.worker_base").WorkerWrapperBase
    result["wrapper"] = f"{wrapper_cls.__module__}.{wrapper_cls.__qualname__}"
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    kwargs: dict[str, Any] = {
        "vllm_config": vllm_config,
        "local_rank": 0,
        "rank": 0,
        "distributed_init_method": init_method,
        "is_driver_worker": True,
    }
    # As vLLM's multiprocessing executor does it (``WorkerProc.__init__``), per release; more
    # than once with ``builds`` (a class is to be said once per process, however often built).
    for _ in range(builds):
        if "vllm_config" in inspect.signature(wrapper_cls).parameters:  # vLLM 0.11
            wrapper = wrapper_cls(vllm_config=vllm_config, rpc_rank=0)
        else:  # vLLM 0.12+: also the lock for the multimodal cache
            wrapper = wrapper_cls(rpc_rank=0, global_rank=0)
            kwargs["shared_worker_lock"] = multiprocessing.get_context("spawn").Lock()
        wrapper.init_worker([dict(kwargs)])
    worker = wrapper.worker
    cls = type(worker)
    result["worker"] = f"{cls.__module__}.{cls.__qualname__}"
    result["mro"] = [f"{k.__module__}.{k.__qualname__}" for k in cls.__mro__]
    _init_process_groups(vllm_config, init_method)

    samples = hasattr(worker_base.WorkerBase, "sample_tokens")  # vLLM 0.12+: sampling apart
    worker.model_runner = StandInRunner(returns_in_sample=samples)
    result["overrides"] = sorted(n for n in ("execute_model", "sample_tokens") if n in vars(cls))
    result["covered"] = {n: _covered(cls, n) for n in ("execute_model", "sample_tokens")}

    recorder = default_recorder()
    recorder.clear()
    steps = []
    for label, scheduler_output in scenario():
        before = len(recorder.records())
        # As EngineCore.step drives the executor: sample_tokens when execute_model gave None.
        if worker.execute_model(scheduler_output) is None and samples:
            worker.sample_tokens(_grammar_output())
        new = recorder.records()[before:]
        steps.append(
            {
                "step": label,
                "vllm_kind": _vllm_kind(scheduler_output),
                "ranges": [[r.name, r.domain] for r in new if hasattr(r, "end_ns")],
            }
        )
    result["steps"] = steps
    result["runner_calls"] = worker.model_runner.calls

    from vllm.v1.engine.core import EngineCore

    names = ("step", "step_with_batch_queue")
    result["engine_core"] = {n: _covered(EngineCore, n) for n in names}
    result["engine_core_code"] = {n: _innermost_module(vars(EngineCore).get(n)) for n in names}
    return result


def _listen_to_warnings(said: list[str]) -> None:
    """Keep the text of every warning shown, wherever it then goes: vllm-ascend 0.13+ sends all
    Python warnings into vLLM's logger (``platform.py``: ``logging.captureWarnings(True)``),
    which replaces ``warnings.showwarning``; ``_showwarnmsg`` is what both call paths use."""
    show = warnings._showwarnmsg  # type: ignore[attr-defined]

    def showing(msg: Any) -> None:
        said.append(f"{msg.category.__name__}: {msg.message}")
        show(msg)

    warnings._showwarnmsg = showing  # type: ignore[attr-defined]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="where to write the JSON result (- for stdout)")
    parser.add_argument("--worker", choices=("npu", "base"), default="npu")
    parser.add_argument(
        "--activation", choices=("startup", "plugin"), default="startup",
        help="call mstx_marks.activate() before vLLM loads, or leave it to vLLM's plugin",
    )  # fmt: skip
    parser.add_argument("--builds", type=int, default=1, help="build the worker this often")
    parser.add_argument(
        "--imports", nargs="+", metavar="MODULE",
        help="after the run, import these modules (torch_npu stubbed) and report each",
    )  # fmt: skip
    args = parser.parse_args(argv)
    os.environ.setdefault("MSTX_MARKS_BACKEND", "record")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    npu_stubs.install()

    said: list[str] = []
    _listen_to_warnings(said)
    with tempfile.TemporaryDirectory() as tmp:
        npu_stubs.install_in_children(Path(tmp) / "startup")
        try:
            result = run(args.worker, args.activation, args.builds, Path(tmp))
            result.update(imports(args.imports or []))
        except Exception:
            result = {"error": traceback.format_exc()}
    result["warnings"] = said
    result["stubbed"] = sorted({n.split(".")[0] for n in npu_stubs.created()})
    text = json.dumps(result, indent=1)
    if args.result == "-":
        print(text)
    else:
        Path(args.result).write_text(text)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
