"""``MSTX_MARKS_CAPTURE``'s text: ``RECIPE:key=value,...`` entries separated by ``;``, read into
the keyword arguments of :func:`~mstx_marks.profiling.recipes.capture`.

>>> parse_entry("update_micro_batch:wait=1,active=2,steps=[2,4],memory=on")
('update_micro_batch', {'wait': 1, 'active': 2, 'steps': [2, 4], 'profile_memory': True})
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["KEYS", "parse_entry"]

_INT_KEYS = ("wait", "warmup", "active", "repeat", "skip_first")
_BOOL_KEYS = ("record_shapes", "with_modules", "profile_memory", "with_stack", "analyse")
#: Short names (verl's ``contents`` words) for the profiler's flags.
_ALIASES = {"module": "with_modules", "memory": "profile_memory", "shapes": "record_shapes",
            "stack": "with_stack", "analysis": "analyse"}  # fmt: skip
#: The keys an entry may give, in the order the listing shows them.
KEYS = (*_INT_KEYS, "steps", "role", "level", "export", *_BOOL_KEYS, "out")
_INT = re.compile(r"[+-]?[0-9]+")
_BOOLS = {"true": True, "1": True, "on": True, "yes": True,
          "false": False, "0": False, "off": False, "no": False}  # fmt: skip


def _parse_value(key: str, value: str) -> Any:
    if key in _INT_KEYS:
        if not _INT.fullmatch(value):
            raise ValueError(f"{key}={value!r} must be an int")
        return int(value)
    if key in _BOOL_KEYS:
        if value.lower() not in _BOOLS:
            raise ValueError(f"{key}={value!r} must be true or false")
        return _BOOLS[value.lower()]
    if key == "steps":
        items = [v.strip() for v in value.strip("[]").replace("|", ",").split(",") if v.strip()]
        if not items or not all(_INT.fullmatch(v) for v in items):
            raise ValueError(f"steps={value!r} must be a list of ints, e.g. steps=[2,4]")
        return [int(v) for v in items]
    return value


def parse_entry(entry: str) -> tuple[str, dict[str, Any]]:
    """One entry's recipe name and options; a ValueError naming what is wrong."""
    name, _, rest = entry.partition(":")
    name = name.strip()
    if not name:
        raise ValueError("expected RECIPE:key=value,..., e.g. rollout_decode:wait=1,active=2")
    options: dict[str, Any] = {}
    # Commas separate keys, except inside [...] (steps=[2,4]).
    for item in re.split(r",(?![^\[]*\])", rest):
        if not item.strip():
            continue
        key, sep, value = (part.strip() for part in item.partition("="))
        key = _ALIASES.get(key, key)
        if not sep or not key or not value:
            raise ValueError(f"{item.strip()!r} is not key=value")
        if key not in KEYS:
            raise ValueError(f"unknown key {key!r}; expected keys among {', '.join(KEYS)}")
        if key in options:
            raise ValueError(f"{key} is given twice")
        options[key] = _parse_value(key, value)
    return name, options
