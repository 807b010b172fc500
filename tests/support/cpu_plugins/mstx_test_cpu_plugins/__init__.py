"""Test support: verl and vLLM plugins that let a real verl GRPO job run on a CPU-only machine.

``verl_cpu`` (a ``verl.plugins`` entry point) registers a ``cpu`` platform with verl; ``vllm_cpu``
(a ``vllm.general_plugins`` entry point) keeps vLLM's CPU linear layers reloadable, so that
verl's weight sync reaches the rollout engine. Both do nothing on a machine with CUDA.
"""
