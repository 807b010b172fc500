"""One step of the per-step model as flat metrics: the keys a trainer's logger is given.

Made from the model as ``summary --json`` prints it (its ``per_step`` part,
:func:`~mstx_marks.analysis.render.rl_steps_text.steps_json`), so a figure logged live and the same
figure read from the job's files afterwards are one function of one model. Times in seconds
(as verl's ``timing_s/*``), shares in [0, 1]; every key starts with ``mstx/``. A statistic over
several processes ends its key (``.../max``, ``.../median``): verl's ``reduce_metrics`` keeps
the maximum of a key ending in ``max``. Role names are kept as keys allow (other characters
become ``_``).

The keys, and what each says: the one table of them is in the docs
(``docs/guides/live-metrics.md``).

>>> per_step = {
...     "steps": [{"key": "1", "length_ns": 10**9, "critical_path": [
...         {"phase": "gen", "time_ns": 6 * 10**8, "waited": {"role": "w", "rank": 0}}],
...         "what_if": None, "rollout_tail": None}],
...     "processes": [{"role": "w", "rank": 0, "length_ns": [10**9], "busy_ns": [4 * 10**8],
...                    "idle_ns": [6 * 10**8], "phases": {"update_actor": [4 * 10**8]}}]}
>>> f = step_figures(per_step, 0)
>>> f["mstx/w/busy_s/max"], f["mstx/w/idle_share/max"], f["mstx/w/update_actor_s/max"]
(0.4, 0.6, 0.4)
>>> f["mstx/critical_path/gen_s"], f["mstx/critical_path/01/gen_s"]
(0.6, 0.6)
>>> f["mstx/critical_path/01/gen/waited/w"]
0
"""

from __future__ import annotations

import re
import statistics
from typing import Any, Mapping, Sequence

from mstx_marks.base import phases

__all__ = ["PREFIX", "WEIGHT_SYNC", "key_part", "step_figures"]

PREFIX = "mstx"
#: The weight sync's phases, each side in its own process (see the verl preset).
WEIGHT_SYNC = tuple(
    p.name
    for p in (
        phases.UPDATE_WEIGHTS,
        phases.ACTOR_SEND_WEIGHTS,
        phases.ROLLOUT_RECEIVE_WEIGHTS,
        phases.ROLLOUT_PAUSE,
        phases.ROLLOUT_RESUME,
    )
)
_NOT_KEY = re.compile(r"[^A-Za-z0-9_.\-]")
_NS = 1e9


def key_part(text: str) -> str:
    """``text`` as one part of a metric's key (``/`` and blanks become ``_``; empty: ``-``).

    >>> key_part("EngineCore_DP0"), key_part("a b/c"), key_part("")
    ('EngineCore_DP0', 'a_b_c', '-')
    """
    return _NOT_KEY.sub("_", text) or "-"


def _registry_phase(name: str) -> bool:
    """A phase of the registry under its own name (not an alias, not an indexed one)."""
    try:
        return phases.canonical(name) == name and not phases.lookup(name).indexed
    except (KeyError, TypeError, ValueError):
        return False


def _stats(out: dict[str, float], key: str, values: Sequence[float], scale: float) -> None:
    out[f"{key}/max"] = max(values) / scale
    out[f"{key}/median"] = statistics.median(values) / scale


def step_figures(per_step: Mapping[str, Any], index: int) -> dict[str, float]:
    """The figures of step ``index`` of ``per_step`` (``summary --json``'s ``per_step``)."""
    step = per_step["steps"][index]
    length = step["length_ns"]
    out: dict[str, float] = {f"{PREFIX}/step_s": length / _NS}
    here = [p for p in per_step["processes"] if p["length_ns"][index] >= 0]
    out[f"{PREFIX}/processes"] = len(here)
    roles: dict[str, list[Mapping[str, Any]]] = {}
    for p in here:
        roles.setdefault(p["role"], []).append(p)
    for role, rows in sorted(roles.items()):
        base = f"{PREFIX}/{key_part(role)}"
        out[f"{base}/ranks"] = len(rows)
        _stats(out, f"{base}/busy_s", [p["busy_ns"][index] for p in rows], _NS)
        shares = [
            p["idle_ns"][index] / p["length_ns"][index] for p in rows if p["length_ns"][index]
        ]
        if shares:
            _stats(out, f"{base}/idle_share", shares, 1.0)
        for name in sorted({n for p in rows for n in p["phases"]}):
            times = [p["phases"][name][index] if name in p["phases"] else 0 for p in rows]
            if _registry_phase(name) and max(times) > 0:
                _stats(out, f"{base}/{key_part(name)}_s", times, _NS)
    for name in WEIGHT_SYNC:
        times = [p["phases"][name][index] for p in here if name in p["phases"]]
        if times and max(times) > 0:
            out[f"{PREFIX}/weight_sync/{name}_s/max"] = max(times) / _NS
    out.update(_tail(step.get("rollout_tail")))
    out.update(_path(step.get("critical_path") or []))
    what_if = step.get("what_if")
    if what_if:
        out[f"{PREFIX}/what_if/saving_s"] = what_if["saving_ns"] / _NS
        out[f"{PREFIX}/what_if/step_s"] = what_if["step_ns"] / _NS
    return out


def _path(path: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The critical path's figures: per phase its time over all its links (a phase on the path
    twice in a step, ``update_weights > gen > update_actor > update_weights``, counts both), and
    per link, numbered in path order, its time and whom it waited for."""
    base = f"{PREFIX}/critical_path"
    out: dict[str, float] = {f"{base}/phases": len(path)}
    total: dict[str, int] = {}
    for k, link in enumerate(path, 1):
        phase = key_part(link["phase"])
        total[phase] = total.get(phase, 0) + link["time_ns"]
        out[f"{base}/{k:02d}/{phase}_s"] = link["time_ns"] / _NS
        waited = link.get("waited")
        if waited:
            out[f"{base}/{k:02d}/{phase}/waited/{key_part(waited['role'])}"] = waited["rank"]
    out.update({f"{base}/{phase}_s": ns / _NS for phase, ns in total.items()})
    return out


def _tail(tail: Mapping[str, Any] | None) -> dict[str, float]:
    """The rollout long tail's figures (none when no engine ran)."""
    if not tail or not tail.get("engines"):
        return {}
    engines = tail["engines"]
    base = f"{PREFIX}/rollout"
    out: dict[str, float] = {
        f"{base}/engines": len(engines),
        f"{base}/slowest_s": tail["slowest_ns"] / _NS,
        f"{base}/median_s": tail["median_ns"] / _NS,
        f"{base}/waiting_share": tail["waiting_share"],
        f"{base}/decode_steps/max": max(e["decode_steps"] for e in engines),
        f"{base}/model_steps/max": max(e["model_steps"] for e in engines),
    }
    if tail["median_ns"]:
        out[f"{base}/slowest_over_median"] = tail["slowest_ns"] / tail["median_ns"]
    slowest = tail.get("slowest")
    if slowest:
        out[f"{base}/slowest/{key_part(slowest['role'])}"] = slowest["rank"]
    if all(e.get("tokens") is not None for e in engines):
        out[f"{base}/tokens"] = sum(e["tokens"] for e in engines)
    return out
