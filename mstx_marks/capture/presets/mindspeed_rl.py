"""MindSpeed-RL's preset: its own MSTX ranges, through mstx_marks.

MindSpeed-RL marks its stages itself: ``mindspeed_rl.utils.utils.mstx_timer_decorator`` wraps
each stage method (``ActorHybridWorkerBase.generate_sequences``, ``.compute_log_prob``,
``.update``, ``ReferenceWorkerBase.compute_ref_log_prob``, ``CriticWorkerBase.compute_values``,
``MegatronShardingManager.enter_infer_mode``, ...) in ``torch_npu.npu.mstx.range_start`` with
the method's ``__qualname__``, default domain, no stream and no ``try/finally``. The preset
replaces that decorator as soon as its module is imported, before the worker modules apply it:
the ranges keep their names (what MindStudio Insight matches), end on exceptions too, and reach
whatever backend is in use (recorded on a CPU box, MSTX on an NPU). MindSpeed-RL has no plugin
entry point: activate it with the launcher (``mstx-marks run``) or Ray's
``worker_process_setup_hook``. If the worker modules were imported before the preset was armed,
they keep MindSpeed-RL's own decorator (one warning says so).

>>> TARGETS[0].path
'mstx_timer_decorator'
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from mstx_marks.base.diagnostics import warn_once
from mstx_marks.capture.instrument import Instrumented, replace
from mstx_marks.capture.presets.target import Options, Target
from mstx_marks.core.ranges import mstx_range

__all__ = ["TARGETS"]

#: Modules that apply the decorator when they are imported.
_USERS = (
    "mindspeed_rl.workers.actor_hybrid_worker",
    "mindspeed_rl.workers.base_worker",
    "mindspeed_rl.workers.critic_worker",
    "mindspeed_rl.workers.reference_worker",
    "mindspeed_rl.workers.integrated_worker",
)


def own_decorator(owner: Any, attr: str, target: Target, options: Options) -> Instrumented:
    early = [m for m in _USERS if m in sys.modules]
    if early:
        warn_once(
            "mindspeed_rl early",
            f"{', '.join(early)} were imported before the mindspeed_rl preset was armed; their"
            " stages keep MindSpeed-RL's own ranges (activate mstx_marks earlier: mstx-marks run)",
        )

    def wrap(o: object, a: str, raw: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(raw)
        def mstx_timer_decorator(func: Callable[..., Any]) -> Callable[..., Any]:
            name = func.__qualname__
            return mstx_range(name, stream=options.stream, sample=options.policy(name))(func)

        return mstx_timer_decorator

    return replace(owner, attr, wrap)


TARGETS: tuple[Target, ...] = (
    Target(
        "mindspeed_rl",
        "mindspeed_rl.utils.utils",
        "mstx_timer_decorator",
        "ActorHybridWorkerBase.generate_sequences",
        "MindSpeed-RL master (2026)",
        own_decorator,
    ),
)
