"""MindSpeed-RL's preset: its own MSTX ranges, through mstx_marks.

MindSpeed-RL marks its stages itself: ``mindspeed_rl.utils.utils.mstx_timer_decorator`` wraps
each stage method (``ActorHybridWorkerBase.generate_sequences``, ``.compute_log_prob``,
``.update``, ``ReferenceWorkerBase.compute_ref_log_prob``, ``CriticWorkerBase.compute_values``,
the models' ``Actor.update_actor`` / ``Critic.update_critic`` / ``Reference.compute_log_prob``,
``BaseWorker.dispatch_transfer_dock_data``, ``MegatronShardingManager.enter_infer_mode``,
``MegatronOffLoader.offload_param``, ...; the registry folds each qualname into its phase)
in ``torch_npu.npu.mstx.range_start`` with the method's ``__qualname__``, default domain, no
stream and no ``try/finally``. The preset replaces that decorator as soon as its module is
imported, before the worker modules apply it: the ranges keep their names (what MindStudio
Insight matches), end on exceptions too, and reach whatever backend is in use (recorded on a
CPU box, MSTX on an NPU). MindSpeed-RL has no plugin entry point: activate it with the launcher
(``mstx-marks run``) or Ray's ``worker_process_setup_hook``. If the worker modules were imported
before the preset was armed, they keep MindSpeed-RL's own decorator (one warning says so).

>>> TARGETS[0].path
'mstx_timer_decorator'
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from mstx_marks.base.diagnostics import warn_once
from mstx_marks.capture.instrument import Instrumented, replace
from mstx_marks.capture.presets.declare import Preset
from mstx_marks.capture.presets.target import Options, Target
from mstx_marks.core.ranges import mstx_range

__all__ = ["ORDER", "PRESETS", "TARGETS"]

ORDER = 4
PRESETS = (
    Preset(
        "mindspeed_rl",
        ("mindspeed_rl", "mindspeed-rl"),
        where="its own `mstx_timer_decorator`, replaced before the workers apply it",
        ranges="its qualnames (`ActorHybridWorkerBase.generate_sequences`, ...), now ended on"
        " exceptions too",
    ),
)

#: Modules that apply the decorator when they are imported (every ``from
#: mindspeed_rl.utils.utils import mstx_timer_decorator`` of Ascend/MindSpeed-RL @ 05a90d77).
_USERS = (
    "mindspeed_rl.models.actor",
    "mindspeed_rl.models.actor_rollout_hybrid",
    "mindspeed_rl.models.critic",
    "mindspeed_rl.models.reference",
    "mindspeed_rl.models.reward",
    "mindspeed_rl.models.rule_verifier",
    "mindspeed_rl.trainer.utils.compute_utils",
    "mindspeed_rl.utils.pad_process",
    "mindspeed_rl.workers.actor_hybrid_worker",
    "mindspeed_rl.workers.base_worker",
    "mindspeed_rl.workers.critic_worker",
    "mindspeed_rl.workers.reference_worker",
    "mindspeed_rl.workers.integrated_worker",
    "mindspeed_rl.workers.resharding.megatron_off_loader",
    "mindspeed_rl.workers.resharding.megatron_sharding_manager",
    "mindspeed_rl.workers.vit_worker",
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
