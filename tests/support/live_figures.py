"""Reading live step figures back (tests/test_live.py, tests/test_live_grpo.py): which step
each logged set describes, and whether a set equals what ``summary --json`` says of that step."""

from __future__ import annotations

from typing import Any, Iterable

from mstx_marks.live.figures import step_figures

#: The figures agree with the files' to the microsecond (seconds).
US = 1e-6
#: What the live figures know and the exported files may not: the batches' tokens (a database
#: or Chrome trace exported at exit, which the summary prefers to the spill, keeps no args).
ARGS_ONLY_IN_SPILLS = {"mstx/rollout/tokens"}
#: Keys of the live figures alone: which step, who was left out, the hold of the log call.
OURS = ("mstx/step", "mstx/left_out", "mstx/live/")


def figures_by_step(
    calls: Iterable[tuple[dict[str, Any], int]],
) -> dict[int, tuple[dict[str, float], int, int]]:
    """Each step's figures as logged: (its ``mstx/`` figures, the call's step, the call's
    index); a step logged twice fails."""
    found: dict[int, tuple[dict[str, float], int, int]] = {}
    for n, (data, step) in enumerate(calls):
        if "mstx/step" in data:
            described = int(data["mstx/step"])
            assert described not in found, f"step {described} logged twice"
            found[described] = ({k: v for k, v in data.items() if k.startswith("mstx/")}, step, n)
    return found


def step_index(per_step: dict[str, Any], key: str) -> int:
    """The index of the step ``key`` in ``summary --json``'s ``per_step``."""
    return [s["key"] for s in per_step["steps"]].index(key)


def agree(live: dict[str, float], per_step: dict[str, Any], key: str) -> None:
    """``live`` (one step's logged figures) equals the figures of step ``key`` that
    ``summary --json``'s ``per_step`` gives: the same keys, each value within :data:`US`."""
    files = step_figures(per_step, step_index(per_step, key))
    keys = set(files) | {k for k in live if not k.startswith(OURS)}
    assert {k for k in keys if k not in live} == set(), "figures the files have, not logged"
    extra = {k for k in keys if k not in files}
    assert extra <= ARGS_ONLY_IN_SPILLS, "figures logged the files do not have"
    off = {k: (live[k], files[k]) for k in keys - extra if abs(live[k] - files[k]) > US}
    assert off == {}
