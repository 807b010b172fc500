"""SGLang's preset: each ``ModelRunner.forward`` as a range named by its batch (SGLang 0.5).

The batch is the first argument, or ``forward_batch=`` where SGLang passes it by keyword
(0.5.23's ``managers/scheduler_components/dynamic_chunk_sizer.py``).

The forward runs in the scheduler subprocess (``run_scheduler_process``), where SGLang loads
its ``sglang.srt.plugins`` entry points first thing, so the preset reaches it through our entry
point without a source edit. The range (domain ``sglang``) is named by the batch's
``ForwardMode`` as SGLang 0.5.23 defines it (``sglang/srt/model_executor/forward_batch_info.py``),
by the member's name, so that older releases' members map too (:data:`MODES`):

- ``EXTEND``, ``SPLIT_PREFILL``: ``prefill_batch``; ``DECODE``: ``decode_batch``; ``MIXED`` (a
  chunked prefill batched with decodes): ``mixed_batch``;
- ``TARGET_VERIFY``: ``verify_batch``, the target model checking a speculative draft (SGLang's
  ``is_extend()`` counts it as an extend, but it is no prefill);
- ``DRAFT_EXTEND_V2`` (0.5.23) and ``DRAFT_EXTEND`` (older releases): ``draft_extend_batch``;
- ``IDLE`` (an empty forward for collective ops), ``PREBUILT`` (never reaches
  ``ModelRunner.forward`` in 0.5.23) and older releases' ``DUMMY_FIRST``: no range;
- any other mode (``DLLM_EXTEND``, a diffusion LM's denoising step over prompt and block, and
  modes of later releases): ``mixed_batch``, still one range per forward.

A forward on a speculative draft worker is named by its mode like any other.

>>> class Mode:
...     name = "TARGET_VERIFY"
>>> class Batch:
...     forward_mode = Mode()
>>> forward_kind(Batch())
'verify_batch'
"""

from __future__ import annotations

from typing import Any

from mstx_marks.capture.presets.built import Built
from mstx_marks.capture.presets.declare import EntryPoint, Preset, RecipeTarget
from mstx_marks.capture.presets.target import Target, named_per_call

__all__ = [
    "BUILT",
    "KINDS",
    "MODES",
    "ORDER",
    "PRESETS",
    "RECIPE_TARGETS",
    "TARGETS",
    "batch_args",
    "forward_kind",
]

ORDER = 3
PRESETS = (
    Preset(
        "sglang",
        ("sglang",),
        # SGLang calls it first thing in its scheduler process, where ModelRunner.forward runs.
        entry_points=(EntryPoint("sglang.srt.plugins"),),
        where="`ModelRunner.forward` in the scheduler process",
        ranges="`prefill_batch` / `decode_batch` / `mixed_batch` / `verify_batch` /"
        " `draft_extend_batch` (domain `sglang`)",
    ),
)

#: ``ForwardMode`` member name -> range name (None: no range).
MODES: dict[str, str | None] = {
    "EXTEND": "prefill_batch",
    "SPLIT_PREFILL": "prefill_batch",
    "DECODE": "decode_batch",
    "MIXED": "mixed_batch",
    "TARGET_VERIFY": "verify_batch",
    "DRAFT_EXTEND": "draft_extend_batch",
    "DRAFT_EXTEND_V2": "draft_extend_batch",
    "IDLE": None,
    "PREBUILT": None,
    "DUMMY_FIRST": None,
}
#: Every range name this preset emits.
KINDS = ("prefill_batch", "decode_batch", "mixed_batch", "verify_batch", "draft_extend_batch")


def forward_kind(forward_batch: Any) -> str | None:
    """The range name for one ``ForwardBatch`` (module docstring), or None for no range."""
    try:
        mode = forward_batch.forward_mode
        name = getattr(mode, "name", None)
        if isinstance(name, str):
            return MODES.get(name, "mixed_batch")
        # No enum name (not SGLang's ForwardMode): its own predicates, as SGLang 0.4 has them.
        if mode.is_idle():
            return None
        return "decode_batch" if mode.is_decode() else "prefill_batch"
    except Exception:  # another SGLang's ForwardBatch: still one range per forward
        return "mixed_batch"


def batch_args(forward_batch: Any) -> dict[str, int]:
    """What a forward's range keeps: its requests and tokens (``batch_size``; an extend's
    ``extend_num_tokens``, one token per request in a decode), host ints, no device sync.

    >>> class Batch:
    ...     batch_size, extend_num_tokens = 4, None
    >>> batch_args(Batch()), batch_args(object())
    ({'reqs': 4, 'tokens': 4}, {})
    """
    try:
        reqs = int(forward_batch.batch_size)
        extend = getattr(forward_batch, "extend_num_tokens", None)
        return {"reqs": reqs, "tokens": reqs if extend is None else int(extend)}
    except Exception:
        return {}


#: ``ModelRunner.forward(forward_batch, ...)`` as a range named by the batch kind.
model_forward = named_per_call(
    lambda runner, batch: forward_kind(batch), KINDS, "forward_batch", batch_args
)


TARGETS: tuple[Target, ...] = (
    Target(
        "sglang",
        "sglang.srt.model_executor.model_runner",
        "ModelRunner.forward",
        "decode_batch",
        "SGLang 0.5",
        model_forward,
        "sglang",
    ),
)
#: SGLang builds its ``ModelRunner`` (or a platform's subclass) in the scheduler process.
BUILT = (Built("sglang", TARGETS[0].module, "ModelRunner.__init__", ("forward",)),)

#: The model runner's forward is one step of vLLM's ``rollout_decode`` recipe too.
RECIPE_TARGETS = {
    "rollout_decode": (
        RecipeTarget(TARGETS[0].module, "ModelRunner.forward", "iteration", "sglang"),
    )
}
