"""Keep vLLM's CPU linear layers reloadable (a ``vllm.general_plugins`` entry point).

After loading, vLLM's CPU build repacks each linear layer's weight for oneDNN or its own GEMM
kernels and (for ``LinearBase``) replaces the parameter by an empty one: verl's weight sync then
fails (``'Parameter' object has no attribute 'weight_loader'``), and a packed copy would not see
reloaded weights anyway. This plugin makes the CPU dispatch keep the parameter and compute with
``torch.nn.functional.linear`` on it, so every weight verl loads is the one used. Slower than
the packed kernels, which does not matter for a tiny model.
"""

from __future__ import annotations

import functools

__all__ = ["keep_linear_weights"]


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
