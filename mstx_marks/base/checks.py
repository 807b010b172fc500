"""The argument checks the configuration helpers share, with one rule for errors.

A value of the wrong type is a ``TypeError``; a value of the right type outside the rule is a
``ValueError``. Each message names the argument, the value and the rule. These run when a
profiler, a schedule or a sampling policy is built, never on the hot path.

>>> check_int(3, "active", minimum=1)
3
>>> check_int(True, "active")
Traceback (most recent call last):
...
TypeError: active must be an int, got bool True
>>> check_names(["npu", "npu", "cpu"], "contents", ("npu", "cpu"))
['npu', 'cpu']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["check_bool", "check_int", "check_ints", "check_names"]


def check_bool(value: object, what: str, why: str = "") -> bool:
    """``value`` if it is True or False; ``why`` is added to the message (a framework's trap)."""
    if not isinstance(value, bool):
        note = f" ({why})" if why else ""
        raise TypeError(f"{what} must be True or False, got {type(value).__name__} {value!r}{note}")
    return value


def check_int(value: object, what: str, minimum: int | None = 0, maximum: int | None = None) -> int:
    """``value`` if it is an int (not a bool) within ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{what} must be <= {maximum}, got {value}")
    return value


def _listed(values: object, what: str, of: str) -> Iterable[object]:
    if isinstance(values, (str, bytes, int)) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a list of {of}, got {type(values).__name__} {values!r}")
    return values


def check_ints(values: object, what: str, minimum: int = 0) -> list[int]:
    """The distinct ints (order kept) of a list, each ``>= minimum``."""
    out: list[int] = []
    for v in _listed(values, what, "ints"):
        if check_int(v, f"{what} entry", minimum) not in out:
            out.append(v)  # type: ignore[arg-type]
    return out


def check_names(values: object, what: str, allowed: Sequence[str] | None = None) -> list[str]:
    """The distinct str (order kept) of a list, each in ``allowed`` when given."""
    out: list[str] = []
    for v in _listed(values, what, "names"):
        if not isinstance(v, str):
            raise TypeError(f"{what} entries must be str, got {type(v).__name__} {v!r}")
        if allowed is not None and v not in allowed:
            raise ValueError(f"{what} entry {v!r} is not one of {', '.join(allowed)}")
        if v not in out:
            out.append(v)
    return out
