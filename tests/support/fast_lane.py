"""A pytest plugin (``-p support.fast_lane``, in pyproject's addopts): the contributors' fast
lane, ``python3 -m pytest -q -m "not engine"``, runs on two workers (pytest-xdist) where the
machine has two cores or more: about 4.5 minutes on 2 cores instead of 7.5 on one.

Only that lane: the full suite (README's command, CI's) runs in one process, since its
real-engine runs go in the background beside it (tests/conftest.py). ``-n 0`` (or any ``-n``,
or ``-p no:xdist``) is taken as given; without pytest-xdist nothing changes."""

from __future__ import annotations

import importlib.util
import os

import pytest

#: The marker expression of the fast lane.
LANE = "not engine"
WORKERS = 2


def _given(args: list[str], *flags: str) -> bool:
    return any(a == f or a.startswith(f) for a in args for f in flags)


def _marker_expression(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a == "-m" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("-m") and len(a) > 2:
            return a[2:]
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, args: list[str]) -> None:
    if _marker_expression(args) != LANE or _given(args, "-n", "--numprocesses", "--dist"):
        return
    if "no:xdist" in args:
        return
    if (os.cpu_count() or 1) < WORKERS or importlib.util.find_spec("xdist") is None:
        return
    args[:] = [*args, "-n", str(WORKERS)]
