"""Profiler configuration with MSTX on: the vocabulary (:mod:`.options`), checked
``experimental_config``/schedule/profiler builders (:mod:`.profiler`), torch_npu's dynamic
profiler file (:mod:`.dynamic_profile`), the scheduled captures of the seed guide
(:mod:`.recipes`) and verl's profiler overrides (:mod:`.verl_config`).
"""
