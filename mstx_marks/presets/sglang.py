"""SGLang's preset: each ``ModelRunner.forward`` as a range named by its batch (SGLang 0.5).

The forward runs in the scheduler subprocess (``run_scheduler_process``), where SGLang loads
its ``sglang.srt.plugins`` entry points first thing, so the preset reaches it through our entry
point without a source edit. The range is ``decode_batch`` for a decode forward,
``prefill_batch`` for extend / mixed / split-prefill ones (``ForwardMode.is_extend()``), and
none for an idle forward (domain ``sglang``).

>>> class Mode:
...     def is_idle(self): return False
...     def is_decode(self): return True
>>> class Batch:
...     forward_mode = Mode()
>>> forward_kind(Batch())
'decode_batch'
"""

from __future__ import annotations

from typing import Any

from . import Target, named_per_call

__all__ = ["TARGETS", "forward_kind"]


def forward_kind(forward_batch: Any) -> str | None:
    """``decode_batch``, ``prefill_batch``, or None for an idle forward."""
    try:
        mode = forward_batch.forward_mode
        if mode.is_idle():
            return None
        return "decode_batch" if mode.is_decode() else "prefill_batch"
    except Exception:  # another SGLang's ForwardBatch: still one range per forward
        return "prefill_batch"


#: ``ModelRunner.forward(forward_batch, ...)`` as a range named by the batch kind.
model_forward = named_per_call(
    lambda runner, batch: forward_kind(batch), ("prefill_batch", "decode_batch")
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
