"""Shared fixtures: every test starts from fresh settings, an empty recorder and no auto-detection.

``Tape`` is a backend that hands out unique range ids and logs every call on one logical clock, so
tests can check that each range ends exactly once, with its own domain, around its own body.
"""

from __future__ import annotations

import contextlib
import fnmatch
import itertools
import os
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
from support.isolation import fresh

import mstx_marks
from mstx_marks.backends.base import Backend, Emitter
from mstx_marks.base import env

# --doctest-modules would import these: support/no_torch.py blocks torch for the rest of the
# run, and engines/ holds scripts for the engines' own venvs (ray, vLLM).
collect_ignore = ["support", "engines"]
# The real engines' runs made in the background, and the GRPO job's runs shared by the tests that
# read them (session fixtures).
pytest_plugins = ["support.background", "support.grpo_runs"]

#: Every variable the library reads (env.VARIABLES is their one home), and the rank.
ENV_VARS = (*(v.name for v in env.VARIABLES), "RANK")

# --- the real engines' tests: marked `engine` -------------------------------------------------
#
# A test that runs a real engine (vLLM, Ray, verl) from its venv (tests/support/engine_venvs.py)
# is marked `engine`, so `pytest -m "not engine"` is the lane a contributor runs while working
# and `-m engine` runs only them. A test that reaches an engine venv unmarked fails, saying so.

#: Modules whose every test runs an engine.
ENGINE_MODULES = ("test_engine_*.py", "test_real_*.py", "test_vllm_ascend.py")
#: Fixtures that run an engine (the background runs of the modules above, and these).
ENGINE_FIXTURES = frozenset({"ray_run", "real_verl", "grpo_plain", "grpo_marked"})
#: Single tests elsewhere that run one, as ``module::name``.
ENGINE_TESTS = frozenset(
    {
        "test_presets_engines.py::test_vllm_032s_real_scheduler_output",
        "test_recipes.py::test_real_vllm_worker_execute_model_is_wrapped_after_import",
    }
)


def runs_an_engine(item: pytest.Item) -> bool:
    """Whether ``item`` runs a real engine: by its module, its fixtures, or its name."""
    if any(fnmatch.fnmatch(item.path.name, pattern) for pattern in ENGINE_MODULES):
        return True
    if ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    return f"{item.path.name}::{getattr(item, 'originalname', item.name)}" in ENGINE_TESTS


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if runs_an_engine(item):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(autouse=True)
def _engines_only_when_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """An unmarked test that reaches an engine venv fails: the lane without engines must stay
    without them (minutes, not a venv build and a job run)."""
    if request.node.get_closest_marker("engine") is not None:
        yield
        return
    from support import engine_venvs

    def refuse(name: str) -> Path:
        pytest.fail(
            f"{request.node.nodeid} uses the {name!r} engine venv but is not marked `engine`:"
            " name it (or its fixture, or its module) in tests/conftest.py's ENGINE_*"
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_venvs, "venv_dir", refuse)
        yield


_fresh = fresh


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fresh settings, recorder, detection cache and once-only warnings; no MSTX_MARKS_* env."""
    for var in [*ENV_VARS, *(k for k in os.environ if k.startswith("MSTX_MARKS_"))]:
        monkeypatch.delenv(var, raising=False)
    _fresh()
    yield
    _fresh()


@pytest.fixture
def recorder() -> mstx_marks.Recorder:
    """The default recorder, selected as the backend."""
    mstx_marks.configure(backend="record")
    return mstx_marks.default_recorder()


@dataclass
class TapeRange:
    name: str
    domain: str
    rid: int
    start: int
    thread: int
    end: Optional[int] = None
    end_domain: Optional[str] = None
    ends: int = 0


@dataclass(eq=False)
class Tape(Backend):
    """Unique ids, exact pairing and a logical clock shared with the code under test."""

    name: str = "tape"
    ranges: dict[int, TapeRange] = field(default_factory=dict)
    marks: list[tuple[str, str, int]] = field(default_factory=list)
    unknown_ends: list[tuple[Any, str]] = field(default_factory=list)
    streams: list[object] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._clock = itertools.count(1)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def tick(self) -> int:
        """The next instant on the clock every start and end also reads."""
        with self._lock:
            return next(self._clock)

    def _start(self, name: str, domain: str) -> int:
        with self._lock:
            rid = next(self._ids)
            self.ranges[rid] = TapeRange(
                name, domain, rid, next(self._clock), threading.get_ident()
            )
            return rid

    def _end(self, rid: Any, domain: str) -> None:
        with self._lock:
            rng = self.ranges.get(rid)
            if rng is None:
                self.unknown_ends.append((rid, domain))
                return
            rng.ends += 1
            if rng.end is None:
                rng.end, rng.end_domain = next(self._clock), domain

    def _mark(self, name: str, domain: str) -> None:
        with self._lock:
            self.marks.append((name, domain, next(self._clock)))

    def emitter(self, stream: object) -> Emitter:
        self.streams.append(stream)
        return Emitter(self, self._start, self._end, self._mark)

    def by_name(self, name: str) -> list[TapeRange]:
        return [r for r in self.ranges.values() if r.name == name]

    def assert_clean(self) -> None:
        """Every range ended exactly once with the domain it started with; no stray ends."""
        assert not self.unknown_ends
        for r in self.ranges.values():
            assert r.ends == 1, r
            assert r.end_domain == r.domain, r
            assert r.end is not None and r.start < r.end, r


@pytest.fixture
def tape() -> Tape:
    """A fresh Tape, selected as the backend."""
    t = Tape()
    mstx_marks.configure(backend=t)
    return t


class Failing(Backend):
    """A backend whose chosen calls raise ``error``; counts the calls that reached it."""

    name = "failing"

    def __init__(self, fail: tuple[str, ...] = ("start",), error: Optional[Exception] = None):
        self.fail = set(fail)
        self.error = error or RuntimeError("backend broke")
        self.calls: list[str] = []

    def _call(self, what: str, result: Any = None) -> Any:
        self.calls.append(what)
        if what in self.fail:
            raise self.error
        return result

    def emitter(self, stream: object) -> Emitter:
        return Emitter(
            self,
            lambda n, d: self._call("start", 1),
            lambda h, d: self._call("end"),
            lambda n, d: self._call("mark"),
        )


@contextlib.contextmanager
def caught() -> Iterator[list[warnings.WarningMessage]]:
    """Record every warning, none deduplicated, so "warned once" can be counted."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        yield got


@pytest.fixture
def warned() -> Any:
    return caught
