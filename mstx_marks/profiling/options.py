"""The vocabulary of torch_npu's profiler and of verl's ``npu`` tool config, defined once.

>>> LEVELS["level1"], AIC_METRICS["AiCoreNone"], "npu" in CONTENTS
('Level1', 'ACL_AICORE_NONE', True)
"""

from __future__ import annotations

__all__ = ["AIC_METRICS", "CONTENTS", "EXPORT_TYPES", "HOST_SYS", "LEVELS", "LEVEL_WORDS"]

#: verl's spelling of a level -> torch_npu's ``ProfilerLevel`` value.
LEVELS: dict[str, str] = {
    "level_none": "Level_none",
    "level0": "Level0",
    "level1": "Level1",
    "level2": "Level2",
}
#: torch_npu's ``ProfilerLevel`` value -> verl's spelling.
LEVEL_WORDS: dict[str, str] = {value: word for word, value in LEVELS.items()}
#: torch_npu's ``AiCMetrics`` attribute names -> values.
AIC_METRICS: dict[str, str] = {
    "AiCoreNone": "ACL_AICORE_NONE",
    "PipeUtilization": "ACL_AICORE_PIPE_UTILIZATION",
    "ArithmeticUtilization": "ACL_AICORE_ARITHMETIC_UTILIZATION",
    "Memory": "ACL_AICORE_MEMORY_BANDWIDTH",
    "MemoryL0": "ACL_AICORE_L0B_AND_WIDTH",
    "MemoryUB": "ACL_AICORE_MEMORY_UB",
    "ResourceConflictRatio": "ACL_AICORE_RESOURCE_CONFLICT_RATIO",
    "L2Cache": "ACL_AICORE_L2_CACHE",
    "MemoryAccess": "ACL_AICORE_MEMORY_ACCESS",
}
EXPORT_TYPES = ("db", "text")
HOST_SYS = ("cpu", "mem", "disk", "network", "osrt", "numa")
#: verl's ``tool_config.npu.contents``; from verl 0.9.1 only a list with ``npu`` collects MSTX.
CONTENTS = ("npu", "cpu", "memory", "shapes", "module", "stack")
