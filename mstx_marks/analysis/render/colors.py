"""The colour of each phase, the one assignment every picture uses: the HTML report's timeline
and legend (:mod:`~.report_html`) and the SVG timeline (:mod:`~.timeline`) give a phase the
same colour, in every run, from its name alone (not from its place in a list, which moves with
what else the run marked).

>>> phase_color("update_actor"), phase_color("my_phase") == phase_color("my_phase")
('#59a14f', True)
"""

from __future__ import annotations

import colorsys
import zlib

__all__ = ["OTHER_COLOR", "PHASE_COLORS", "phase_color"]

#: The colour of the phases past a legend's cut, all alike.
OTHER_COLOR = "#c8c8c8"

#: The colours of the phases RL jobs mark most, fixed so that they are told apart at a glance;
#: any other phase's colour comes from a hash of its name.
PHASE_COLORS = {
    "step": "#9aa5b1", "train_step": "#9aa5b1", "training_step": "#9aa5b1",
    "global_step": "#9aa5b1", "ProfilerStep": "#9aa5b1",
    "generate_sequences": "#4e79a7", "vllm_one_step": "#a0cbe8", "prefill_batch": "#2f6b9a",
    "decode_batch": "#7fb3d5", "mixed_batch": "#5d8fbf", "sampling": "#17becf",
    "compute_log_prob": "#f28e2b", "compute_ref_log_prob": "#ffbe7d", "compute_values": "#b6992d",
    "reward": "#e15759", "compute_rm_score": "#ff9d9a", "compute_score": "#c0392b",
    "adv": "#edc948", "update_actor": "#59a14f", "update_critic": "#8cd17d",
    "update_weights": "#b07aa1", "resharding_to_infer": "#d4a6c8",
    "resharding_to_train": "#8e5d8a", "save_checkpoint": "#79706e", "testing": "#bab0ac",
    "forward": "#499894", "backward": "#86bcb6", "forward_backward": "#3b7c78",
    "dataloader": "#f1ce63", "offload": "#d7b5a6", "onload": "#9d7660",
    "train_batch": "#2ca02c", "infer_batch": "#1f77b4", "mini_batch": "#d37295",
    "micro_batch": "#fabfd2", "tool_calls": "#ff7f0e",
}  # fmt: skip


def phase_color(name: str) -> str:
    """The colour of a phase, as ``#rrggbb``: from its name alone, so one phase has one colour
    in every picture and every run (:data:`PHASE_COLORS`, else a hash of the name).

    >>> phase_color("step") == phase_color("train_step"), len(phase_color("x\\ud800"))
    (True, 7)
    """
    fixed = PHASE_COLORS.get(name)
    if fixed:
        return fixed
    h = zlib.crc32(name.encode("utf-8", "replace"))
    r, g, b = colorsys.hls_to_rgb(
        (h % 360) / 360, (40 + (h >> 12) % 3 * 8) / 100, (55 + (h >> 9) % 3 * 12) / 100
    )
    return "#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in (r, g, b)))
