"""Test support: verl and vLLM plugins that let a real verl GRPO job run on a CPU-only machine.

``verl_cpu`` (a ``verl.plugins`` entry point) registers a ``cpu`` platform with verl; ``vllm_cpu``
(``vllm.general_plugins`` entry points) keeps vLLM's CPU linear layers reloadable, so that
verl's weight sync reaches the rollout engine (both do nothing on a machine with CUDA), and lets
vLLM 0.32's ``AsyncLLM.pause_generation`` take the flag verl 0.9.1 passes (disaggregated modes).
"""
