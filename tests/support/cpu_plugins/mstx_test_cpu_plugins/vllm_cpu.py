"""Two ``vllm.general_plugins`` entry points for verl 0.9.1 on vLLM 0.32's CPU build.

``keep_linear_weights``: after loading, vLLM's CPU build repacks each linear layer's weight for
oneDNN or its own GEMM kernels and (for ``LinearBase``) replaces the parameter by an empty one:
verl's weight sync then fails (``'Parameter' object has no attribute 'weight_loader'``), and a
packed copy would not see reloaded weights anyway. This plugin makes the CPU dispatch keep the
parameter and compute with ``torch.nn.functional.linear`` on it, so every weight verl loads is
the one used. Slower than the packed kernels, which does not matter for a tiny model.

``pause_generation_takes_verls_flag``: verl's vLLM server pauses the engine for a weight sync
(``abort_all_requests``, disaggregated modes only) with ``AsyncLLM.pause_generation(
wait_for_inflight_requests=False, clear_cache=...)``, vLLM up to 0.1x's signature; vLLM 0.32
takes ``mode="abort" | "wait" | "keep"`` instead and refuses the flag. This makes it take both
(``False`` is ``"abort"``, ``True`` is ``"wait"``). vLLM loads general plugins in the process
that builds the engine's arguments, which is verl's server actor, where ``AsyncLLM`` lives.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Optional

__all__ = ["keep_linear_weights", "pause_generation_takes_verls_flag"]


def keep_linear_weights() -> None:
    import torch

    if torch.cuda.is_available():
        return
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "__mstx_test_keeps_weights__", False):
        return

    @functools.wraps(original)
    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if weight is None or weight.is_meta or weight.ndim != 2:
            return original(layer, remove_weight)
        layer.cpu_linear = torch.nn.functional.linear
        return None

    dispatch.__mstx_test_keeps_weights__ = True  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = dispatch


def pause_generation_takes_verls_flag() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    original = AsyncLLM.pause_generation
    if getattr(original, "__mstx_test_verls_flag__", False):
        return
    params = inspect.signature(original).parameters
    if "wait_for_inflight_requests" in params or "mode" not in params:
        return  # a vLLM that takes verl's flag, or one this shim does not know

    @functools.wraps(original)
    async def pause_generation(
        self: Any, *args: Any, wait_for_inflight_requests: Optional[bool] = None, **kwargs: Any
    ) -> Any:
        if wait_for_inflight_requests is not None and "mode" not in kwargs:
            kwargs["mode"] = "wait" if wait_for_inflight_requests else "abort"
        return await original(self, *args, **kwargs)

    pause_generation.__mstx_test_verls_flag__ = True  # type: ignore[attr-defined]
    AsyncLLM.pause_generation = pause_generation  # type: ignore[method-assign]
