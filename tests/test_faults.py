"""Faults are contained to what failed and retried after a back-off (mstx_marks/faults.py).

The mstx backend's own faults (C layer, wrapper, current_stream) are in test_backends_mstx.py;
these use custom backends, the recorder tee and the back-off schedule itself.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import pytest
from conftest import Failing, caught

import mstx_marks
from mstx_marks import configure, current_backend, instant, mark, mstx_range, status
from mstx_marks.backends.base import Backend, Emitter
from mstx_marks.core.configuration import state
from mstx_marks.core.faults import FIRST_DELAY_S, MAX_DELAY_S, Health


def _later(seconds: float = 3600.0) -> None:
    health = state().health
    now = health.clock()
    health.clock = lambda: now + seconds


def test_back_off_doubles_per_part_up_to_the_cap() -> None:
    h = Health(clock=lambda: 0.0)
    delays = [h.delay("backend") for _ in range(12)]
    assert delays[:4] == [FIRST_DELAY_S, 2 * FIRST_DELAY_S, 4 * FIRST_DELAY_S, 8 * FIRST_DELAY_S]
    assert delays[-1] == MAX_DELAY_S and max(delays) == MAX_DELAY_S
    assert h.delay(("stream", "current")) == FIRST_DELAY_S  # each part has its own back-off
    h.forget_backoff()
    assert h.delay("backend") == FIRST_DELAY_S


def test_a_transient_fault_is_not_permanent() -> None:
    backend = Failing(("start",))
    configure(backend=backend)
    work = mstx_range("w")(lambda: 1)
    with caught() as w:
        assert [work(), work()] == [1, 1]
    assert len(w) == 1 and "not recorded for 1 s" in str(w[0].message)
    assert current_backend().name == "noop" and backend.calls == ["start"]
    backend.fail.clear()  # the hiccup is over
    _later()
    with caught() as w2:
        assert [work(), work(), work()] == [1, 1, 1]
    assert not w2
    assert current_backend() is backend
    # the first call after the back-off made the retry (and recorded nothing); then two ranges
    assert backend.calls == ["start", "start", "end", "start", "end"]
    assert status().faults == {"failing call: RuntimeError": 1}


def test_the_recorder_beside_a_failing_device_loses_nothing() -> None:
    device = Failing(("start", "end", "mark"))
    configure(backend=device, record=True)
    rec = mstx_marks.default_recorder()
    with caught() as w:
        for i in range(5):
            with mark("step"):
                instant("tick")
                assert i >= 0
    assert len(w) == 1  # one warning for the device, then its faults are counted
    records = rec.records()
    assert [r.name for r in records if r.kind == "range"] == ["step"] * 5
    assert [r.name for r in records if r.kind == "instant"] == ["tick"] * 5
    assert not any(getattr(r, "open", False) for r in records)
    s = status()
    assert s.backend == "failing+record" and s.recording and s.recorded == 10
    assert sum(s.faults.values()) >= 1


def test_a_device_beside_the_recorder_comes_back_after_its_back_off() -> None:
    device = Failing(("start",))
    configure(backend=device, record=True)
    with caught(), mark("a"):
        pass
    device.fail.clear()
    _later()
    with mark("b"):  # makes the retry
        pass
    with mark("c"):
        pass
    assert device.calls[-2:] == ["start", "end"]
    names = [r.name for r in mstx_marks.default_recorder().records()]
    assert names == ["a", "b", "c"]


class _BadRearm(Backend):
    name = "bad_rearm"

    def emitter(self, stream: object) -> Emitter:
        return Emitter(self, lambda n, d: 1, lambda h, d: None, lambda n, d: None)

    def rearm(self) -> None:
        raise RuntimeError("rearm broke")


def test_a_custom_backends_raising_rearm_warns_and_does_not_leak() -> None:
    with caught() as w:
        configure(backend=_BadRearm())
        with mark("x"):
            pass
    assert any("rearm broke" in str(x.message) for x in w)
    assert current_backend().name == "bad_rearm"


def test_an_emitter_that_cannot_be_built_for_a_stream_leaves_host_ranges_alone() -> None:
    class NoStreams(Backend):
        name = "no_streams"

        def __init__(self) -> None:
            self.started: list[str] = []

        def emitter(self, stream: object) -> Emitter:
            if stream is not None:
                raise RuntimeError("no streams here")
            return Emitter(self, lambda n, d: self.started.append(n) or 1, _end, _end)

    def _end(*_: Any) -> None:
        return None

    backend = NoStreams()
    with caught() as w:
        configure(backend=backend)  # gates made by earlier tests build their emitters here
        with mark("on_stream", stream="current"):
            pass
        with mark("host"):
            pass
    assert backend.started == ["on_stream", "host"]
    about_current = [str(x.message) for x in w if "stream 'current'" in str(x.message)]
    assert len(about_current) == 1 and "host only" in about_current[0]


def test_status_says_what_happened_in_plain_words() -> None:
    configure(backend=Failing(("start",)))
    with caught(), mark("x"):
        pass
    text = str(status())
    assert "backend: noop (configured: failing)" in text
    assert "fault x1: failing call: RuntimeError" in text
    assert "tried again in" in text


@pytest.mark.parametrize("which", ["start", "end", "mark"])
def test_faults_under_warnings_as_errors_never_reach_the_body(which: str) -> None:
    import warnings

    configure(backend=Failing((which,)))
    ran = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with mark("x"):
            instant("i")
            ran.append(1)
    assert ran == [1]


def test_an_instant_with_args_beside_a_failing_device_is_still_recorded() -> None:
    configure(backend=Failing(("mark",)), record=True)
    with caught():
        for i in range(3):
            instant("tick", args={"i": i})
    got = [(r.name, r.args) for r in mstx_marks.default_recorder().records()]
    assert got == [("tick", {"i": 0}), ("tick", {"i": 1}), ("tick", {"i": 2})]


# --- the user's exception arriving while the fault handling runs a backend's code ---------------
# A watchdog's exception sent to the thread (PyThreadState_SetAsyncExc) lands at the next call's
# return, function entry or backward jump: inside a custom backend's hook as likely as anywhere.
# Every ``except Exception`` around such a hook must let the user's through (base/interrupts.py).


class Cancelled(Exception):
    """A watchdog's exception, sent as its class."""


def _send_here() -> None:
    """Send :class:`Cancelled` to this thread: it is raised as this call returns."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(threading.get_ident()), ctypes.py_object(Cancelled)
    )


class _Sends(Failing):
    """A backend whose hook named ``at`` receives the user's exception while it runs."""

    def __init__(self, at: str, fail: tuple[str, ...] = ()) -> None:
        super().__init__(fail)
        self.at = at

    def degrade(self) -> bool:
        if self.at == "degrade":
            _send_here()
        return True

    def rearm(self) -> None:
        if self.at == "rearm":
            _send_here()

    def emitter(self, stream: object) -> Emitter:
        if self.at == "emitter":
            _send_here()
        return super().emitter(stream)

    def keep_args(self, handle: Any, args: Any) -> None:
        if self.at == "keep_args":
            _send_here()


def test_the_users_exception_arriving_in_a_backends_degrade_reaches_the_user() -> None:
    configure(backend=_Sends("degrade", fail=("start",)))
    with caught(), pytest.raises(Cancelled) as got, mark("step"):
        pass
    assert isinstance(got.value.__context__, RuntimeError)  # the fault it arrived during
    assert status().faults == {"failing call: RuntimeError": 1}  # counted, before degrade()


def test_the_users_exception_arriving_as_a_backend_builds_its_calls_reaches_the_user() -> None:
    with caught(), pytest.raises(Cancelled):
        configure(backend=_Sends("emitter"))  # builds the calls now, or at the first range
        with mark("step"):
            pass


def test_the_users_exception_in_a_devices_degrade_beside_the_recorder_reaches_the_user() -> None:
    configure(backend=_Sends("degrade", fail=("start",)), record=True)
    with caught(), pytest.raises(Cancelled), mark("step"):
        pass


def test_the_users_exception_arriving_in_a_backends_rearm_reaches_the_user() -> None:
    backend = _Sends("none", fail=("start",))
    configure(backend=backend)
    with caught(), mark("step"):  # the fault: the backend rests
        pass
    backend.fail.clear()
    backend.at = "rearm"
    _later()
    with caught(), pytest.raises(Cancelled), mark("step"):  # the retry rearms it
        pass


def test_the_users_exception_arriving_as_args_are_kept_reaches_the_user() -> None:
    configure(backend=_Sends("keep_args"))
    with caught(), pytest.raises(Cancelled), mark("step", args={"i": 1}):
        pass
