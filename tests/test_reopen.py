"""A profiler started inside ranges already open shows them (mstx_marks/backends/reopen.py).

torch.profiler runs for real on CPU. For torch_npu the MSTX calls go through the fake C layer
(``support/fake_mstx_c.py``: id 0 while no collector listens, as ``mstx_mgr.cpp`` does), once
with the double of ``torch_npu.npu.mstx`` and once with the REAL ``mstx.py`` of the published
wheel, on the C path and on the wrapper path. The profiler there is a STAND-IN (the real
``torch_npu.profiler`` needs CANN): a class named ``profile`` in ``torch_npu.profiler.profiler``
whose ``start``/``stop`` begin and end a collection session, and whose ``step`` follows a
schedule's ``current_action`` the way torch_npu 2.14.0's ``profile.step`` does.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fake_mstx_c import FakeTorchNpu, capture_output
from support.real_torch_npu import FLAVOURS, install

import mstx_marks
from mstx_marks import configure, mark
from mstx_marks.backends.mstx import MstxBackend
from mstx_marks.backends.reopen import WAITING, Waiting

torch = pytest.importorskip("torch")


def _names(prof: Any) -> list[str]:
    return [e.name for e in prof.events()]


def test_a_torch_profiler_started_inside_a_range_holds_it() -> None:
    configure(backend="torch")
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with mark("update_actor"), mark("micro_batch"):
        with torch.profiler.profile(activities=cpu) as prof, mark("forward"):
            torch.mm(torch.ones(4, 4), torch.ones(4, 4))
        with mark("after_the_capture"):
            pass
    names = _names(prof)
    # Both ranges that began before the profiler are in it, once each, around what ran inside.
    assert names.count("update_actor") == 1 and names.count("micro_batch") == 1
    assert names.count("forward") == 1 and "after_the_capture" not in names
    events = {e.name: e for e in prof.events()}
    outer, inner = events["update_actor"], events["forward"]
    assert outer.time_range.start <= inner.time_range.start
    assert inner.time_range.end <= outer.time_range.end
    assert WAITING.waiting() == 0


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_each_window_of_a_scheduled_torch_profiler_holds_the_open_range() -> None:
    configure(backend="torch")
    windows: list[list[str]] = []
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    # "training" is open across the whole run, begun before the profiler.
    with (
        mark("training"),
        torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=schedule,
            on_trace_ready=lambda p: windows.append(_names(p)),
            acc_events=False,
        ) as prof,
    ):
        for _ in range(8):
            with mark("step_body"):
                torch.ones(2) + 1
            prof.step()
    assert len(windows) == 2
    for names in windows:
        assert names.count("training") == 1  # started again in each window, ended in it
        assert names.count("step_body") == 2  # the window's two active steps
    assert WAITING.waiting() == 0


class Action(enum.Enum):  # torch_npu.profiler.scheduler.ProfilerAction's names
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def _stand_in_profiler(env: FakeTorchNpu) -> type:
    """The stand-in profiler class (module docstring), put where torch_npu has it."""

    class profile:  # torch_npu's name
        def __init__(self, actions: list[Action] | None = None) -> None:
            self.actions = actions or [Action.RECORD]
            self.step_num = 0
            self.current_action = self.actions[0]
            self.sessions: list[Any] = []
            self.col: Any = None

        def _transit(self, new: Action) -> None:
            recording = new in (Action.RECORD, Action.RECORD_AND_SAVE)
            if self.col is not None and not recording:
                self.col.stop()
                self.col = None
            elif self.col is None and recording:
                self.col = env.c.collect()
                self.sessions.append(self.col)
            self.current_action = new

        def start(self) -> None:
            self._transit(self.current_action)

        def step(self) -> None:
            if self.current_action is Action.RECORD_AND_SAVE and self.col is not None:
                self.col.stop()  # the window ends inside step, as on_trace_ready runs there
                self.col = None
            self.step_num += 1
            self._transit(self.actions[min(self.step_num, len(self.actions) - 1)])

        def stop(self) -> None:
            if self.col is not None:
                self.col.stop()
                self.col = None

    module = types.ModuleType("torch_npu.profiler.profiler")
    module.profile = profile  # type: ignore[attr-defined]
    module._KinetoProfile = profile  # type: ignore[attr-defined]
    env.modules["torch_npu.profiler.profiler"] = module
    import sys

    sys.modules["torch_npu.profiler.profiler"] = module
    return profile


@pytest.fixture(params=[(f, m) for f in FLAVOURS for m in ("direct", "wrapper")])
def npu_profiler(request: pytest.FixtureRequest) -> Iterator[tuple[FakeTorchNpu, type]]:
    flavour, mode = request.param
    import sys

    with install(flavour) as env, capture_output() as cap:
        profile = _stand_in_profiler(env)
        try:
            configure(backend=MstxBackend(wrapper_only=mode == "wrapper"))
            yield env, profile
        finally:
            sys.modules.pop("torch_npu.profiler.profiler", None)
    assert not cap.lines, cap.lines  # torch_npu's wrapper printed no [ERROR] line


def test_an_npu_profiler_started_inside_a_stage_holds_the_stage(
    npu_profiler: tuple[FakeTorchNpu, type],
) -> None:
    env, profile = npu_profiler
    # MindSpeed-RL's shape: the stage's range opens, the stage starts the profiler inside it.
    with mark("ActorHybridWorkerBase.update", domain="default"), mark("outer", domain="verl"):
        prof = profile()
        prof.start()
        with mark("micro_batch"):
            pass
        prof.stop()
    (col,) = prof.sessions
    assert [(r.message, r.domain) for r in col.ranges] == [
        ("ActorHybridWorkerBase.update", "default"),
        ("outer", "verl"),
        ("micro_batch", "default"),
    ]
    col.assert_clean()  # every range started in the session ended in it, with its own domain
    assert WAITING.waiting() == 0
    # Nothing reached C for the ranges outside any session beyond their unrecorded start.
    assert [c[0] for c in env.c.calls].count("range_end") == 3


def test_a_stage_that_ends_while_the_npu_profiler_runs_ends_once(
    npu_profiler: tuple[FakeTorchNpu, type],
) -> None:
    _, profile = npu_profiler
    prof = profile()
    with mark("compute_log_prob"):
        prof.start()
    with mark("later"):
        pass
    prof.stop()
    (col,) = prof.sessions
    assert col.messages() == ["compute_log_prob", "later"]
    col.assert_clean()


def test_each_npu_profiler_window_holds_the_open_range(
    npu_profiler: tuple[FakeTorchNpu, type],
) -> None:
    _, profile = npu_profiler
    a = Action
    plan = [a.NONE, a.WARMUP, a.RECORD, a.RECORD_AND_SAVE, a.NONE, a.RECORD, a.RECORD_AND_SAVE]
    with mark("training"):
        prof = profile(plan)
        prof.start()
        for _ in range(len(plan) - 1):
            with mark("step_body"):
                pass
            prof.step()
        prof.stop()
    assert len(prof.sessions) == 2
    for col in prof.sessions:
        assert col.messages().count("training") == 1
        col.assert_clean()
    assert WAITING.waiting() == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["open", "close", "start", "stop"]), max_size=40))
def test_every_range_started_again_ends_exactly_once(ops: list[str]) -> None:
    """Any order of range starts and ends, profiler starts and stops: each handle a collector
    gave is ended exactly once, and only while that collector listens."""
    waiting = Waiting()
    listening = [False]
    given_out: list[int] = []
    ended: list[int] = []

    def start(name: str, domain: str) -> int:
        if not listening[0]:
            return 0
        given_out.append(len(given_out) + 1)
        return given_out[-1]

    def end(handle: int, domain: str) -> None:
        assert listening[0], "ended after the collector stopped"
        ended.append(handle)

    tokens: list[int] = []
    for op in ops:
        if op == "open":
            tokens.append(waiting.hold("r", "d", start, end))
        elif op == "close" and tokens:
            waiting.release(tokens.pop(0))
        elif op == "start" and not listening[0]:
            listening[0] = True
            waiting.reopen()
        elif op == "stop" and listening[0]:
            waiting.suspend()
            listening[0] = False
    listening[0] = True
    for token in tokens:
        waiting.release(token)
    assert sorted(ended) == sorted(set(ended)) == given_out
    assert waiting.waiting() == 0


def test_beside_the_recorder_the_npu_capture_still_holds_the_stage(
    npu_profiler: tuple[FakeTorchNpu, type],
) -> None:
    """MSTX_MARKS_OUT on an NPU host: the tee records every range and the device part of a
    range begun before the profiler is still started inside it."""
    _, profile = npu_profiler
    configure(record=True)
    with mark("update_actor"):
        prof = profile()
        prof.start()
        with mark("micro_batch"):
            pass
        prof.stop()
    (col,) = prof.sessions
    assert col.messages() == ["update_actor", "micro_batch"]
    col.assert_clean()
    recorded = [r.name for r in mstx_marks.default_recorder().records()]
    assert recorded == ["update_actor", "micro_batch"]  # each once in the recorder
    assert WAITING.waiting() == 0
