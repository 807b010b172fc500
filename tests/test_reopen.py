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

import collections
import contextlib
import enum
import itertools
import json
import os
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fake_mstx_c import FakeTorchNpu, capture_output
from support.real_torch_npu import FLAVOURS, install

import mstx_marks
from mstx_marks import configure, mark
from mstx_marks.backends.base import Backend, Emitter
from mstx_marks.backends.mstx import MstxBackend
from mstx_marks.backends.reopen import WAITING, Token, Waiting, watch_profilers

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def not_yet_watching() -> Iterator[None]:
    """Each test starts before any watched profiler ran (``WAITING.watching`` is set for good
    once one has, as in a process), and leaves the flag as it found it."""
    was, WAITING.watching = WAITING.watching, False
    yield
    WAITING.watching = was


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

    tokens: list[Token] = []
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


# --- issue 35 item 7: threads, fork, windows ------------------------------------------------


class Device(Backend):
    """A faithful double of a device that a profiler listens to (MSTX's rules): while a session
    listens, ``start`` gives a fresh id from one process-wide counter and logs it in every
    listening session; otherwise it gives 0 ("not recorded"), which is never ended. Every start
    and end is counted, under the device's own lock, as torch_npu's C side keeps its own."""

    name = "device"
    reopens = True

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.sessions: list[list[tuple[str, int, str]]] = []  # those listening now
        self.started: list[int] = []
        self.ended: list[int] = []

    def _start(self, name: str, domain: str) -> int:
        with self.lock:
            if not self.sessions:
                return 0
            rid = next(self.ids)
            self.started.append(rid)
            for session in self.sessions:
                session.append(("start", rid, name))
            return rid

    def _end(self, rid: int, domain: str) -> None:
        with self.lock:
            self.ended.append(rid)
            for session in self.sessions:
                session.append(("end", rid, ""))

    def listen(self) -> list[tuple[str, int, str]]:
        session: list[tuple[str, int, str]] = []
        with self.lock:
            self.sessions.append(session)
        return session

    def deafen(self, session: list[tuple[str, int, str]]) -> None:
        with self.lock:  # by identity: two sessions that saw the same events are equal lists
            del self.sessions[next(i for i, s in enumerate(self.sessions) if s is session)]

    def emitter(self, stream: object) -> Emitter:
        return Emitter(self, self._start, self._end, lambda name, domain: None)

    def assert_each_start_ended_once(self) -> None:
        counts = collections.Counter(self.ended)
        assert not [rid for rid in counts if rid not in set(self.started)], "unknown ends"
        never = [rid for rid in self.started if counts[rid] == 0]
        twice = [rid for rid in self.started if counts[rid] > 1]
        assert not never and not twice, f"never ended: {never}; ended twice: {twice}"


def _device_profiler(device: Device) -> type:
    """A stand-in profiler over ``device``: ``start`` opens a session, ``stop`` closes it, and
    each ``step`` taken in a window's last step (``RECORD_AND_SAVE``) closes the session and
    opens the next window's, as a schedule of back-to-back windows does. Put where torch_npu
    has its profiler and watched there, as the library watches the real one."""

    class profile:  # torch_npu's name
        def __init__(self, plan: list[Action] | None = None) -> None:
            self.plan = plan or [Action.RECORD, Action.RECORD_AND_SAVE]
            self.step_num = 0
            self.current_action = self.plan[0]
            self.session: list[tuple[str, int, str]] | None = None
            self.windows: list[list[tuple[str, int, str]]] = []

        def _transit(self, new: Action) -> None:
            recording = new in (Action.RECORD, Action.RECORD_AND_SAVE)
            if self.session is not None and not recording:
                device.deafen(self.session)
                self.session = None
            elif self.session is None and recording:
                self.session = device.listen()
                self.windows.append(self.session)
            self.current_action = new

        def start(self) -> None:
            self._transit(self.current_action)

        def step(self) -> None:
            if self.current_action is Action.RECORD_AND_SAVE and self.session is not None:
                device.deafen(self.session)
                self.session = None
            self.step_num += 1
            self._transit(self.plan[self.step_num % len(self.plan)])

        def stop(self) -> None:
            if self.session is not None:
                device.deafen(self.session)
                self.session = None

    module = types.ModuleType("torch_npu.profiler.profiler")
    module.profile = profile  # type: ignore[attr-defined]
    sys.modules["torch_npu.profiler.profiler"] = module
    watch_profilers()
    return profile


@contextlib.contextmanager
def on_device() -> Iterator[tuple[Device, type]]:
    """A fresh :class:`Device` as the backend, and its watched stand-in profiler."""
    dev = Device()
    saved = sys.modules.get("torch_npu.profiler.profiler")
    try:
        profile = _device_profiler(dev)
        configure(backend=dev)
        yield dev, profile
    finally:
        if saved is None:
            sys.modules.pop("torch_npu.profiler.profiler", None)
        else:
            sys.modules["torch_npu.profiler.profiler"] = saved


@pytest.fixture
def device() -> Iterator[tuple[Device, type]]:
    with on_device() as pair:
        yield pair


def _run_together(*jobs: Callable[[], None]) -> None:
    """Run each job on its own thread, all released at once, switching as often as Python can;
    re-raise the first failure."""
    gate = threading.Barrier(len(jobs))
    failed: list[BaseException] = []

    def run(job: Callable[[], None]) -> None:
        try:
            gate.wait()
            job()
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    if failed:
        raise failed[0]


PROFILER_OPS = st.lists(st.sampled_from(["start", "step", "step", "stop"]), max_size=12)
RANGE_OPS = st.lists(st.sampled_from(["open", "open", "close"]), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    profilers=st.lists(PROFILER_OPS, min_size=2, max_size=3),
    ranges=st.lists(RANGE_OPS, min_size=1, max_size=3),
    watched_before=st.booleans(),
)
def test_profilers_on_threads_end_every_range_they_started_again_exactly_once(
    profilers: list[list[str]], ranges: list[list[str]], watched_before: bool
) -> None:
    """Threads that start, step and stop profilers at once, beside threads whose ranges start
    and end: every handle the device gave is ended exactly once, and nothing stays held. With
    ``watched_before`` a profiler ran earlier in the process, so ranges recorded in a window are
    held too (reopen.py's contract, point 4); else the first start here sets that."""
    WAITING.watching = watched_before
    with on_device() as (dev, profile):
        _start_step_stop_on_threads(dev, profile, profilers, ranges)


def _start_step_stop_on_threads(
    dev: Device, profile: type, profilers: list[list[str]], ranges: list[list[str]]
) -> None:
    names = iter(itertools.count())

    def drive(ops: list[str]) -> Callable[[], None]:
        def job() -> None:
            prof, running = profile(), False
            for op in ops:
                if op == "start" and not running:
                    prof.start()
                    running = True
                elif op == "step" and running:
                    prof.step()
                elif op == "stop" and running:
                    prof.stop()
                    running = False
            if running:
                prof.stop()

        return job

    def record(ops: list[str]) -> Callable[[], None]:
        def job() -> None:
            opened: list[Any] = []
            for op in ops:
                if op == "open":
                    opened.append(mark(f"r{next(names)}").start())
                elif opened:
                    opened.pop(0).end()
            for r in opened:
                r.end()

        return job

    # Ranges open before any profiler, so that every profiler has held ranges to start again.
    before = [mark(f"before_{i}").start() for i in range(32)]
    for _ in range(8):  # each example a few times: the threads interleave differently each time
        _run_together(*map(drive, profilers), *map(record, ranges))
    for r in before:
        r.end()
    dev.assert_each_start_ended_once()
    assert WAITING.waiting() == 0


def test_a_forked_child_captures_none_of_its_parents_open_ranges(
    device: tuple[Device, type],
) -> None:
    """A child forked inside a range (a DataLoader worker forked in a training step) profiles
    itself: its capture holds its own ranges, not the parent's still open at the fork."""
    dev, profile = device
    read, write = os.pipe()
    with mark("parent_step"):
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            status = 1
            try:
                os.close(read)
                prof = profile([Action.RECORD])
                prof.start()
                with mark("child_work"):
                    pass
                prof.stop()
                names = [name for what, _, name in prof.windows[0] if what == "start"]
                os.write(write, json.dumps(names).encode())
                status = 0
            finally:
                os._exit(status)
    os.close(write)
    with os.fdopen(read) as got:
        names = json.loads(got.read() or "null")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert names == ["child_work"]
    dev.assert_each_start_ended_once()


def _window_names(window: list[tuple[str, int, str]]) -> list[str]:
    return [name for what, _, name in window if what == "start"]


def _assert_whole(window: list[tuple[str, int, str]]) -> None:
    """Every range the window saw start, it saw end, once."""
    started = [rid for what, rid, _ in window if what == "start"]
    ended = [rid for what, rid, _ in window if what == "end"]
    assert sorted(started) == sorted(ended), window


SCHEDULE = [
    Action.RECORD,
    Action.RECORD_AND_SAVE,
    Action.NONE,
    Action.RECORD,
    Action.RECORD_AND_SAVE,
    Action.NONE,
    Action.RECORD,
    Action.RECORD_AND_SAVE,
]


ALONE_OR_RECORDED = [
    pytest.param(False, id="device"),
    pytest.param(True, id="device+record"),
]


@pytest.mark.parametrize("record", ALONE_OR_RECORDED)
def test_a_range_begun_in_a_window_is_in_each_later_window_it_is_open_in(
    device: tuple[Device, type], record: bool
) -> None:
    """A schedule of three windows. "epoch" begins inside the first window (so the profiler
    records it at once) and stays open through the last; "training" was open before the
    profiler started. Each window holds both, once, whole."""
    dev, profile = device
    configure(record=record)
    with mark("training"):
        prof = profile(SCHEDULE)
        prof.start()
        epoch = mark("epoch").start()
        for _ in range(len(SCHEDULE) - 1):
            with mark("step_body"):
                pass
            prof.step()
        epoch.end()
        prof.stop()
    assert len(prof.windows) == 3
    for window in prof.windows:
        names = _window_names(window)
        assert names.count("training") == 1 and names.count("epoch") == 1, names
        _assert_whole(window)
    dev.assert_each_start_ended_once()
    assert WAITING.waiting() == 0


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
@pytest.mark.parametrize("record", ALONE_OR_RECORDED)
def test_a_range_begun_in_a_torch_profiler_window_is_in_each_later_window(record: bool) -> None:
    """The same with torch.profiler for real: "epoch" begins in the first window's first
    active step and ends after the third window; each window's trace holds it once."""
    configure(backend="torch", record=record)
    windows: list[list[str]] = []
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=3)
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=schedule,
        on_trace_ready=lambda p: windows.append(_names(p)),
        acc_events=False,
    )
    prof.start()
    epoch = None
    for i in range(12):
        if i == 2:
            epoch = mark("epoch").start()  # in the first window's first active step
        with mark("step_body"):
            torch.ones(2) + 1
        prof.step()
    assert epoch is not None
    epoch.end()
    prof.stop()
    assert len(windows) == 3
    for names in windows:
        assert names.count("epoch") == 1, names
        assert names.count("step_body") == 2
    assert WAITING.waiting() == 0
