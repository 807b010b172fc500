"""Megatron-core's (and MindSpeed's DualPipeV) pipeline schedules, as msprof-analyze's ``pp_chart``
reads them.

``pp_chart`` (msprof-analyze 26.2.0, ``recipes/pp_chart``, ``prof_exports/pp_chart_export.py``)
takes the MSTX ranges whose message is LIKE ``%forward%``, ``%backward%`` or
``%WeightGradStore_pop%`` (LIKE's ``_`` matches any character, so ``WeightGradStore.pop`` too),
JOINed to ``TASK`` on ``connectionId``: only a range started on a stream has a device task, so
every range here is on the current NPU stream (``stream="current"``), whatever the preset's
options say. It charts the device times, per ``STEP_TIME`` step; for DualPipeV it also reads
``META_DATA`` ``pp_info`` (``pp_type``, ``microbatch_num``) and ``distributed_args``. The
messages are the ones its guide (``docs/zh/advanced_features/pp_chart_instruct.md``) has users
emit by hand: ``str({"name": "forward_step"})``, ``{'name': 'backward_step'}``, and under
DualPipeV ``forward_step_with_model_graph`` (``forward_backward_overlaping`` when called with
``extra_block_kwargs``), ``forward_step_no_model_graph``, ``backward_step_with_model_graph``,
``WeightGradStore.pop`` (no range when its cache is empty), each with ``current_microbatch``
when the call passes it.

Patched (read from megatron-core 0.16.1's ``megatron/core/pipeline_parallel/schedules.py``,
where the schedules call ``forward_step`` and ``backward_step`` as module globals):

- ``schedules:forward_step`` and ``schedules:backward_step``: the ranges above;
- ``schedules:forward_backward_no_pipelining`` / ``..._pipelining_without_interleaving`` /
  ``..._pipelining_with_interleaving``: no range; the first call records ``pp_info``
  (``no_pipelining`` / ``1f1b`` / ``interleaved``, its ``num_microbatches``) and, once
  ``parallel_state`` is initialized, ``distributed_args`` (the sizes ``pp_chart`` maps ranks to
  stages with) through :func:`mstx_marks.export.ascend_db.add_metadata`;
- MindSpeed's ``mindspeed.core.pipeline_parallel.dualpipev.dualpipev_schedules`` functions above
  (as the guide names them; not checked against a MindSpeed release here).

>>> pp_message("forward_step", {"current_microbatch": 3})
"{'name': 'forward_step', 'current_microbatch': 3}"
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.phases import Phase
from mstx_marks.capture.instrument import Instrumented, replace
from mstx_marks.capture.presets.declare import Preset
from mstx_marks.capture.presets.target import Options, Target
from mstx_marks.core.ranges import Mark

__all__ = ["ORDER", "PHASES", "PRESETS", "TARGETS", "pp_message"]

ORDER = 5
PRESETS = (
    Preset(
        "megatron",
        ("megatron-core", "megatron_core"),
        on_its_own=True,
        where="megatron-core's pipeline schedules (`forward_step`, `backward_step`), MindSpeed's"
        " DualPipeV and `WeightGradStore.pop`",
        ranges="`{'name': 'forward_step'}` / `{'name': 'backward_step'}` ... on the current stream,"
        " as msprof-analyze's `pp_chart` reads them; `pp_info` metadata",
    ),
)

_SCHEDULES = "megatron.core.pipeline_parallel.schedules"
_DUALPIPEV = "mindspeed.core.pipeline_parallel.dualpipev.dualpipev_schedules"
_CORE = "megatron-core 0.16 (the schedules' module globals since 0.x)"
_MINDSPEED = "MindSpeed with DualPipeV (as msprof-analyze's pp_chart guide names them)"


#: The names only this preset emits (the package registers them).
PHASES = tuple(
    Phase(name, framework="megatron", description=what, emitted="preset")
    for name, what in (
        ("forward_step", "one micro-batch's forward in Megatron's pipeline schedule"),
        ("backward_step", "one micro-batch's backward in Megatron's pipeline schedule"),
        ("forward_step_with_model_graph", "DualPipeV forward (MindSpeed)"),
        ("forward_step_no_model_graph", "DualPipeV forward without the model graph (MindSpeed)"),
        ("backward_step_with_model_graph", "DualPipeV backward (MindSpeed)"),
        ("WeightGradStore.pop", "DualPipeV deferred weight gradients (MindSpeed)"),
        ("forward_backward_func", "Megatron's pipeline schedule (no range: records pp_info)"),
    )
)
#: pp_info's ``pp_type`` of each schedule.
_PP_TYPES = {
    "forward_backward_no_pipelining": "no_pipelining",
    "forward_backward_pipelining_without_interleaving": "1f1b",
    "forward_backward_pipelining_with_interleaving": "interleaved",
    "forward_backward_pipelining_with_cutinhalf": "dualpipev",
}


def pp_message(name: str, kwargs: dict[str, Any]) -> str:
    """The guide's message: ``str({"name": name})``, plus ``current_microbatch`` when given."""
    msg: dict[str, Any] = {"name": name}
    if name == "forward_step_with_model_graph" and kwargs.get("extra_block_kwargs") is not None:
        msg["name"] = "forward_backward_overlaping"  # the guide's spelling
    if "current_microbatch" in kwargs:
        msg["current_microbatch"] = kwargs["current_microbatch"]
    return str(msg)


def _empty_weight_grads(args: tuple[Any, ...]) -> bool:
    owner = args[0] if args else None
    try:
        return len(owner.cache) == 0  # type: ignore[union-attr]
    except Exception:
        return False


def pp_range(owner: Any, attr: str, target: Target, options: Options) -> Instrumented:
    """Each call a range on the current stream named by :func:`pp_message`."""
    plain = Mark(pp_message(target.phase, {}), stream="current")
    sites: dict[str, Mark] = {plain.name: plain}
    pop = target.phase == "WeightGradStore.pop"

    def wrap(o: object, a: str, raw: Any) -> Any:
        func = getattr(raw, "__func__", raw)

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            if pop and _empty_weight_grads(args):
                return func(*args, **kwargs)
            try:
                text = pp_message(target.phase, kwargs)
                site = sites.get(text)
                if site is None:
                    site = sites.setdefault(text, Mark(text, stream="current"))
                opened = site.start(sampled=False)
            except Exception as exc:  # never break the schedule for a range
                warn_once(("pp range", target.path), f"megatron preset: {target.path}: {exc}")
                opened = None
            try:
                return func(*args, **kwargs)
            finally:
                if opened is not None:
                    opened.end()

        return classmethod(call) if isinstance(raw, classmethod) else call

    return replace(owner, attr, wrap)


def _distributed_args() -> dict[str, int] | None:
    try:
        from megatron.core import parallel_state as ps  # type: ignore[import-not-found,unused-ignore]

        if not ps.model_parallel_is_initialized():
            return None
        import torch

        return {
            "tensor_model_parallel_size": ps.get_tensor_model_parallel_world_size(),
            "pipeline_model_parallel_size": ps.get_pipeline_model_parallel_world_size(),
            "data_parallel_size": ps.get_data_parallel_world_size(),
            "context_parallel_size": ps.get_context_parallel_world_size(),
            "expert_model_parallel_size": ps.get_expert_model_parallel_world_size(),
            "world_size": torch.distributed.get_world_size(),
        }
    except Exception:
        return None


def pp_metadata(owner: Any, attr: str, target: Target, options: Options) -> Instrumented:
    """No range: the first call records ``pp_info`` (and ``distributed_args`` when known)."""
    from mstx_marks.export.ascend_db import add_metadata

    done: list[bool] = []

    def wrap(o: object, a: str, raw: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(raw)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not done:
                done.append(True)
                try:
                    pp_type = _PP_TYPES[target.path]
                    info = {"pp_type": pp_type, "microbatch_num": kwargs["num_microbatches"]}
                    add_metadata("pp_info", info)
                    dist = _distributed_args()
                    if dist is not None:
                        add_metadata("distributed_args", dist)
                except Exception as exc:
                    warn_once(("pp info", target.path), f"megatron preset: no pp_info ({exc})")
            return raw(*args, **kwargs)

        return call

    return replace(owner, attr, wrap)


TARGETS: tuple[Target, ...] = (
    Target("megatron", _SCHEDULES, "forward_step", "forward_step", _CORE, pp_range),
    Target("megatron", _SCHEDULES, "backward_step", "backward_step", _CORE, pp_range),
    *(Target("megatron", _SCHEDULES, name, "forward_backward_func", _CORE, pp_metadata)
      for name in list(_PP_TYPES)[:3]),
    *(Target("megatron", _DUALPIPEV, name, name, _MINDSPEED, pp_range)
      for name in ("forward_step_with_model_graph", "forward_step_no_model_graph",
                   "backward_step_with_model_graph", "backward_step")),
    Target("megatron", _DUALPIPEV, "WeightGradStore.pop", "WeightGradStore.pop", _MINDSPEED,
           pp_range),
    Target("megatron", _DUALPIPEV, "forward_backward_pipelining_with_cutinhalf",
           "forward_backward_func", _MINDSPEED, pp_metadata),
)  # fmt: skip
