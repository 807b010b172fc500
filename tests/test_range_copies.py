"""The begin/end logic is written out several times for speed (ranges.py keeps the plain-function
wrapper, the sampled wrapper, ``Mark.__enter__``/``__exit__``, ``instant`` and the shared
``_begin``/``_end`` of the other kinds apart). This drives every copy through the same scripted
backend behaviours and compares each backend call log against ONE reference model, as
pyinstrument tests its fast copies against a reference implementation."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any, Callable

import pytest

import mstx_marks
from mstx_marks import configure, every, instant, mark, mstx_range
from mstx_marks.backends.base import Backend, Emitter

#: What the scripted backend's start returns (or does), per scenario.
SCENARIOS = ["handle", "zero", "none", "start_raises", "end_raises", "disabled", "sampled_out"]


class Scripted(Backend):
    name = "scripted"

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.log: list[tuple[str, Any, str]] = []

    def emitter(self, stream: object) -> Emitter:
        def start(name: str, domain: str) -> Any:
            self.log.append(("start", name, domain))
            if self.scenario == "start_raises":
                raise RuntimeError("start broke")
            return {"zero": 0, "none": None}.get(self.scenario, 7)

        def end(handle: Any, domain: str) -> None:
            self.log.append(("end", handle, domain))
            if self.scenario == "end_raises":
                raise RuntimeError("end broke")

        def point(name: str, domain: str) -> None:
            self.log.append(("instant", name, domain))

        return Emitter(self, start, end, point)


def reference(scenario: str, user_raises: bool) -> tuple[list[tuple[str, Any, str]], int]:
    """What every copy must do: the backend calls of ONE range named "r" in domain "d", and how
    many warnings. The user's exception changes nothing about the calls."""
    del user_raises
    if scenario in ("disabled", "sampled_out"):
        return [], 0
    calls: list[tuple[str, Any, str]] = [("start", "r", "d")]
    if scenario in ("handle", "end_raises"):
        calls.append(("end", 7, "d"))  # a falsy handle (0, None) means "not recorded": no end
    return calls, int(scenario in ("start_raises", "end_raises"))


class Boom(Exception):
    pass


def _body(raises: bool) -> int:
    if raises:
        raise Boom
    return 1


def _copies(sample: Any) -> dict[str, Callable[[bool], Any]]:
    """Each copy of the begin/end logic, as a call running one range "r" in domain "d"."""

    @mstx_range("r", domain="d", sample=sample)
    def plain(raises: bool) -> int:
        return _body(raises)

    @mstx_range("r", domain="d", sample=sample)
    async def coro(raises: bool) -> int:
        return _body(raises)

    @mstx_range("r", domain="d", sample=sample)
    def gen(raises: bool) -> Iterator[int]:
        yield _body(raises)

    @mstx_range("r", domain="d", sample=sample)
    async def agen(raises: bool) -> AsyncIterator[int]:
        yield _body(raises)

    async def first(raises: bool) -> int:
        async for x in agen(raises):
            return x
        raise AssertionError("empty")

    site = mark("r", domain="d", sample=sample)

    def with_block(raises: bool) -> int:
        with site:
            return _body(raises)

    def started(raises: bool) -> int:
        r = site.start()
        try:
            return _body(raises)
        finally:
            r.end()

    return {
        "plain": plain,
        "coro": lambda raises: asyncio.run(coro(raises)),
        "gen": lambda raises: next(iter(gen(raises))),
        "agen": lambda raises: asyncio.run(first(raises)),
        "with": with_block,
        "start/end": started,
    }


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("user_raises", [False, True])
@pytest.mark.parametrize("copy", list(_copies(None)))
def test_every_copy_matches_the_reference(scenario: str, user_raises: bool, copy: str) -> None:
    backend = Scripted(scenario)
    configure(backend=backend, enabled=scenario != "disabled")
    # every(2) lets call 0 through: a warm-up call takes it, so the measured one is sampled out.
    sample = every(2) if scenario == "sampled_out" else None
    call = _copies(sample)[copy]
    if sample is not None:
        call(False)
        backend.log.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        if user_raises:
            with pytest.raises(Boom):
                call(True)
        else:
            assert call(False) == 1
    want_calls, want_warnings = reference(scenario, user_raises)
    assert backend.log == want_calls
    ours = [x for x in w if issubclass(x.category, mstx_marks.MstxMarksWarning)]
    assert len(ours) == want_warnings


@pytest.mark.parametrize("scenario", ["handle", "start_raises", "disabled"])
def test_instant_matches_the_reference(scenario: str) -> None:
    backend = Scripted(scenario)
    configure(backend=backend, enabled=scenario != "disabled")
    instant("r", domain="d")
    # instant has no start/end: one call, or none when disabled (start_raises: instant works).
    assert backend.log == ([] if scenario == "disabled" else [("instant", "r", "d")])
