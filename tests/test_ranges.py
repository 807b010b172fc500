"""mark / mstx_range / instant: every function kind, reuse, exceptions, faults, names, pickling."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import multiprocessing
import pickle
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Failing, Tape, caught
from support.threads import run_threads

import mstx_marks
from mstx_marks import (
    Phase,
    configure,
    default_recorder,
    instant,
    mark,
    mstx_range,
)
from mstx_marks.core.process import PROCESS

# --- module-level targets (pickle finds them by qualified name) --------------------------------


@mstx_range
def double_it(x: int) -> int:
    """Doubles."""
    return 2 * x


@mstx_range("triple", domain="verl")
def triple(x: int) -> int:
    return 3 * x


@mark("quadruple")
def quadruple(x: int) -> int:
    return 4 * x


@mstx_range("child_work", domain="verl")
def child_work(x: int) -> tuple[int, int, list[tuple[Any, ...]]]:
    """Runs in a spawned child; reports what the child's recorder holds after the call."""
    import os

    return x * 3, os.getpid(), []


def run_in_child(x: int) -> tuple[int, int, list[tuple[Any, ...]]]:
    result, pid, _ = child_work(x)
    recs = [
        (r.name, r.domain, r.kind, r.end_ns is not None, r.pid)
        for r in default_recorder().records()
    ]
    return result, pid, recs


class Worker:
    def __init__(self, k: int) -> None:
        self.k = k

    @mstx_range
    def add(self, x: int) -> int:
        return x + self.k

    @mstx_range("worker_mul", domain="verl")
    def mul(self, x: int) -> int:
        return x * self.k

    @mstx_range
    @staticmethod
    def static_below(x: int) -> int:
        return x + 1

    @staticmethod
    @mstx_range
    def static_above(x: int) -> int:
        return x + 2

    @mstx_range("cls_below")
    @classmethod
    def cls_below(cls, x: int) -> str:
        return f"{cls.__name__}{x}"

    @classmethod
    @mstx_range("cls_above")
    def cls_above(cls, x: int) -> str:
        return f"{cls.__name__}{x}"

    @mark("static_mark_below")
    @staticmethod
    def static_mark_below(x: int) -> int:
        return x + 3


class SubWorker(Worker):
    pass


def names(rec: mstx_marks.Recorder) -> list[tuple[str, str, str]]:
    return [(r.name, r.domain, r.kind) for r in rec.records()]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- mark as context manager and decorator ------------------------------------------------------


def test_mark_context_manager_records_one_closed_range(recorder: mstx_marks.Recorder) -> None:
    with mark("step"):
        inside = recorder.records()
    (after,) = recorder.records()
    assert [(r.name, r.domain, r.open) for r in inside] == [("step", "default", True)]
    assert (after.name, after.domain, after.kind, after.open) == ("step", "default", "range", False)
    assert after.end_ns >= after.start_ns


def test_mark_domain_and_enter_returns_the_mark(recorder: mstx_marks.Recorder) -> None:
    m = mark("gen", domain="verl")
    with m as entered:
        assert entered is m
    assert names(recorder) == [("gen", "verl", "range")]
    assert (m.name, m.domain) == ("gen", "verl")


def test_mark_as_decorator_one_range_per_call(recorder: mstx_marks.Recorder) -> None:
    assert [quadruple(i) for i in range(3)] == [0, 4, 8]
    assert names(recorder) == [("quadruple", "default", "range")] * 3
    assert all(r.end_ns is not None for r in recorder.records())


def test_mstx_range_bare_uses_qualname(recorder: mstx_marks.Recorder) -> None:
    @mstx_range
    def local() -> str:
        return "x"

    @mstx_range()
    def empty_parens() -> str:
        return "y"

    assert double_it(4) == 8
    assert local() == "x"
    assert empty_parens() == "y"
    assert Worker(1).add(2) == 3
    assert [r.name for r in recorder.records()] == [
        "double_it",
        "test_mstx_range_bare_uses_qualname.<locals>.local",
        "test_mstx_range_bare_uses_qualname.<locals>.empty_parens",
        "Worker.add",
    ]


def test_mstx_range_called_with_domain_and_current_stream(recorder: mstx_marks.Recorder) -> None:
    @mstx_range("update_actor", domain="verl", stream="current")
    def update(x: int) -> int:
        return x + 1

    assert update(1) == 2
    assert names(recorder) == [("update_actor", "verl", "range")]


def test_phase_is_a_name_and_explicit_domain_wins(recorder: mstx_marks.Recorder) -> None:
    phase = Phase("compute_log_prob", "verl")
    with mark(phase):
        pass

    @mstx_range(phase, domain="other")
    def f() -> None:
        return None

    f()
    instant(phase)
    assert names(recorder) == [
        ("compute_log_prob", "verl", "range"),
        ("compute_log_prob", "other", "range"),
        ("compute_log_prob", "verl", "instant"),
    ]


def test_instant_records_a_mark(tape: Tape) -> None:
    instant("weights_synced", domain="verl")
    instant("tick")
    instant("on_stream", stream=object())  # backends without streams ignore it
    assert [(n, d) for n, d, _ in tape.marks] == [
        ("weights_synced", "verl"),
        ("tick", "default"),
        ("on_stream", "default"),
    ]
    assert not tape.ranges


def test_instant_on_record_backend_is_an_instant_record(recorder: mstx_marks.Recorder) -> None:
    instant("x", domain="d1")
    (rec,) = recorder.records()
    assert (rec.name, rec.domain, rec.kind) == ("x", "d1", "instant")
    assert isinstance(rec, mstx_marks.InstantRecord)


def test_stream_object_is_ignored_by_backends_without_streams(
    recorder: mstx_marks.Recorder,
) -> None:
    with caught() as w, mark("s", stream=object()):
        pass
    assert names(recorder) == [("s", "default", "range")]
    assert not w


def test_stream_string_other_than_current_is_refused() -> None:
    with pytest.raises(ValueError, match="'main'"):
        mark("s", stream="main")


# --- metadata and kinds --------------------------------------------------------------------------


def test_wraps_keeps_metadata_and_signature() -> None:
    def original(a: int, *, b: str = "x") -> str:
        """Doc."""
        return f"{a}{b}"

    original.custom = 7  # type: ignore[attr-defined]
    for decorated in (mstx_range(original), mstx_range("n")(original), mark("n")(original)):
        assert decorated is not original
        assert decorated.__name__ == "original"
        assert decorated.__qualname__ == original.__qualname__
        assert decorated.__doc__ == "Doc."
        assert decorated.__module__ == __name__
        assert decorated.__wrapped__ is original  # type: ignore[attr-defined]
        assert decorated.custom == 7  # type: ignore[attr-defined]
        assert inspect.signature(decorated) == inspect.signature(original)
    assert double_it.__doc__ == "Doubles."


async def _coro() -> int:
    return 1


def _gen() -> Any:
    yield 1


async def _agen() -> Any:
    yield 1


KIND_CHECKS = [
    (_coro, inspect.iscoroutinefunction),
    (_gen, inspect.isgeneratorfunction),
    (_agen, inspect.isasyncgenfunction),
]


@pytest.mark.parametrize(("func", "check"), KIND_CHECKS, ids=["coro", "gen", "agen"])
@pytest.mark.parametrize("how", ["bare", "named", "mark"])
def test_inspect_kind_is_kept(func: Any, check: Any, how: str) -> None:
    deco = {"bare": mstx_range, "named": mstx_range("k"), "mark": mark("k")}[how]
    wrapped = deco(func)
    assert check(wrapped)
    others = [c for _, c in KIND_CHECKS if c is not check]
    assert not any(c(wrapped) for c in others)


@pytest.mark.parametrize(
    ("call", "result", "name"),
    [
        (lambda: Worker.static_below(1), 2, "Worker.static_below"),
        (lambda: Worker(0).static_below(1), 2, "Worker.static_below"),
        (lambda: Worker.static_above(1), 3, "Worker.static_above"),
        (lambda: Worker(0).static_above(1), 3, "Worker.static_above"),
        (lambda: Worker.cls_below(1), "Worker1", "cls_below"),
        (lambda: SubWorker.cls_below(1), "SubWorker1", "cls_below"),
        (lambda: Worker(0).cls_above(2), "Worker2", "cls_above"),
        (lambda: SubWorker.cls_above(2), "SubWorker2", "cls_above"),
        (lambda: Worker.static_mark_below(1), 4, "static_mark_below"),
        (lambda: Worker(5).mul(2), 10, "worker_mul"),
    ],
)
def test_methods_static_and_class_methods(
    recorder: mstx_marks.Recorder, call: Any, result: Any, name: str
) -> None:
    assert call() == result
    assert [r.name for r in recorder.records()] == [name]
    assert recorder.records()[0].end_ns is not None


def test_static_and_class_methods_keep_their_descriptor_kind() -> None:
    """Whichever order the decorators come in, the class holds the descriptor, the descriptor
    the range's wrapper, and the wrapper the user's plain function: never a wrapper around the
    descriptor, nor a descriptor left unwrapped (``@staticmethod`` outermost keeps the kind by
    itself; what could go wrong there is the range missing inside it)."""
    for attr, kind in [
        ("static_below", staticmethod),
        ("static_above", staticmethod),
        ("cls_below", classmethod),
        ("cls_above", classmethod),
    ]:
        descriptor = Worker.__dict__[attr]
        assert isinstance(descriptor, kind), attr
        wrapper = descriptor.__func__
        inner = getattr(wrapper, "__wrapped__", None)
        assert inspect.isfunction(inner) and inner is not wrapper, attr
        assert inner.__qualname__ == f"Worker.{attr}", attr


def test_decorating_a_non_callable_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="42"):
        mark("x")(42)  # type: ignore[arg-type]


# --- coroutines, generators, async generators --------------------------------------------------


def test_coroutine_range_spans_the_awaited_body_not_creation(tape: Tape) -> None:
    seen: list[int] = []

    @mstx_range("coro")
    async def work(x: int) -> int:
        seen.append(tape.tick())
        await asyncio.sleep(0)
        seen.append(tape.tick())
        return x * 2

    coro = work(3)
    created = tape.tick()
    assert not tape.ranges
    assert run(coro) == 6
    (r,) = tape.ranges.values()
    assert created < r.start < seen[0] < seen[1] < r.end  # type: ignore[operator]
    tape.assert_clean()


def test_generator_range_from_first_resume_to_exhaustion(tape: Tape) -> None:
    body: list[int] = []

    @mstx_range("gen")
    def numbers(n: int) -> Any:
        body.append(tape.tick())
        for i in range(n):
            got = yield i
            if got is not None:
                body.append(got)
        body.append(tape.tick())
        return "done"

    g = numbers(2)
    assert not tape.ranges
    assert next(g) == 0
    assert len(tape.ranges) == 1 and tape.by_name("gen")[0].end is None
    assert g.send(100) == 1
    with pytest.raises(StopIteration) as stop:
        next(g)
    assert stop.value.value == "done"
    (r,) = tape.ranges.values()
    assert r.start < body[0] and body[-1] < r.end  # type: ignore[operator]
    assert 100 in body
    tape.assert_clean()


def test_generator_range_ends_on_close_and_on_error(tape: Tape) -> None:
    @mstx_range("gen")
    def forever() -> Any:
        while True:
            yield 1

    g = forever()
    next(g)
    g.close()
    err = KeyError("inside")

    @mstx_range("gen_err")
    def failing() -> Any:
        yield 1
        raise err

    g2 = failing()
    next(g2)
    with pytest.raises(KeyError) as info:
        next(g2)
    assert info.value is err

    g3 = forever()
    next(g3)
    with pytest.raises(ValueError, match="thrown"):
        g3.throw(ValueError("thrown"))
    assert [r.name for r in tape.ranges.values()] == ["gen", "gen_err", "gen"]
    tape.assert_clean()


def test_unstarted_generator_never_opens_a_range(tape: Tape) -> None:
    @mstx_range("gen")
    def g() -> Any:
        yield 1

    gen = g()
    gen.close()
    assert not tape.ranges


def test_async_generator_range_from_first_resume_to_exhaustion(tape: Tape) -> None:
    body: list[Any] = []

    @mstx_range("agen", domain="verl")
    async def stream(n: int) -> Any:
        body.append(tape.tick())
        for i in range(n):
            await asyncio.sleep(0)
            got = yield i
            body.append(got)
        body.append(tape.tick())

    async def main() -> list[Any]:
        agen = stream(3)
        assert not tape.ranges
        out = [await agen.__anext__()]
        out.append(await agen.asend("sent"))
        out += [x async for x in agen]
        return out

    assert run(main()) == [0, 1, 2]
    (r,) = tape.ranges.values()
    assert r.domain == "verl"
    assert r.start < body[0] and body[-1] < r.end  # type: ignore[operator]
    assert "sent" in body
    tape.assert_clean()


def test_async_generator_range_ends_on_aclose_and_on_error(tape: Tape) -> None:
    closed: list[bool] = []

    @mstx_range("agen")
    async def forever() -> Any:
        try:
            while True:
                yield 1
        finally:
            closed.append(True)

    err = LookupError("in agen")

    @mstx_range("agen_err")
    async def failing() -> Any:
        yield 1
        raise err

    @mstx_range("agen_throw")
    async def catching() -> Any:
        try:
            yield 1
        except ValueError:
            yield "caught"

    async def main() -> None:
        a = forever()
        await a.__anext__()
        await a.aclose()
        b = failing()
        await b.__anext__()
        with pytest.raises(LookupError) as info:
            await b.__anext__()
        assert info.value is err
        c = catching()
        await c.__anext__()
        assert await c.athrow(ValueError("x")) == "caught"
        with pytest.raises(StopAsyncIteration):
            await c.__anext__()

    run(main())
    assert closed == [True]
    assert [r.name for r in tape.ranges.values()] == ["agen", "agen_err", "agen_throw"]
    tape.assert_clean()


# --- one mark object, many entries ---------------------------------------------------------------


def test_nested_in_itself_each_entry_is_its_own_range(tape: Tape) -> None:
    m = mark("again")
    with m:
        a = tape.tick()
        with m:
            b = tape.tick()
            with m:
                c = tape.tick()
            d = tape.tick()
        e = tape.tick()
    with m:
        f = tape.tick()
    outer, mid, inner, last = sorted(tape.ranges.values(), key=lambda r: r.start)
    assert outer.start < a < mid.start < b < inner.start < c < inner.end < d < mid.end  # type: ignore[operator]
    assert mid.end < e < outer.end < last.start < f < last.end  # type: ignore[operator]
    tape.assert_clean()


def test_reentry_through_exit_stack_pairs_with_its_own_start(tape: Tape) -> None:
    m = mark("stacked")
    with m:
        a = tape.tick()
        with contextlib.ExitStack() as stack:
            stack.enter_context(m)
            b = tape.tick()
        c = tape.tick()
    outer, inner = sorted(tape.ranges.values(), key=lambda r: r.start)
    assert outer.start < a < inner.start < b < inner.end < c < outer.end  # type: ignore[operator]
    tape.assert_clean()


def test_manual_enter_exit_from_different_functions_while_nested(tape: Tape) -> None:
    m = mark("hooks")

    def pre_hook() -> None:
        m.__enter__()

    def post_hook() -> None:
        m.__exit__(None, None, None)

    with m:
        pre_hook()
        b = tape.tick()
        post_hook()
        c = tape.tick()
    outer, inner = sorted(tape.ranges.values(), key=lambda r: r.start)
    assert inner.start < b < inner.end < c < outer.end  # type: ignore[operator]


def test_enter_and_exit_in_two_hooks_on_four_threads_pair_every_range(tape: Tape) -> None:
    # A module's pre- and post-hooks share one Mark: __enter__ and __exit__ run in two functions.
    m = mark("hooked")
    n_threads, rounds = 4, 200
    barrier = threading.Barrier(n_threads)

    def pre_hook() -> None:
        m.__enter__()

    def post_hook() -> None:
        m.__exit__(None, None, None)

    def work() -> None:
        barrier.wait()
        for _ in range(rounds):
            with m:  # the layer around the hooked call uses the same Mark
                pre_hook()
                tape.tick()
                post_hook()

    run_threads(work, [()] * n_threads)
    assert len(tape.ranges) == 2 * n_threads * rounds
    tape.assert_clean()  # every range ended exactly once


def test_interleaved_asyncio_tasks_sharing_a_mark_end_their_own_ranges(tape: Tape) -> None:
    m = mark("shared_task")
    order: list[tuple[str, int]] = []

    async def task(tag: str, first: asyncio.Event, second: asyncio.Event) -> None:
        with m:
            order.append((tag, tape.tick()))
            first.set()
            await second.wait()
            order.append((tag, tape.tick()))

    async def main() -> None:
        a_in, b_in = asyncio.Event(), asyncio.Event()
        # a enters first (the slot), b enters while a is inside, a leaves first.
        ta = asyncio.create_task(task("a", a_in, b_in))
        await a_in.wait()
        tb = asyncio.create_task(task("b", b_in, asyncio.Event()))
        await b_in.wait()
        await ta
        tb.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tb

    asyncio.run(main())
    ranges = sorted(tape.ranges.values(), key=lambda r: r.start)
    a_ticks = [t for tag, t in order if tag == "a"]
    assert len(ranges) == 2
    a_range = ranges[0]
    assert a_range.start < a_ticks[0] and a_ticks[1] < a_range.end  # type: ignore[operator]
    tape.assert_clean()


def test_one_mark_entered_by_many_threads_at_once(tape: Tape) -> None:
    m = mark("shared", domain="verl")
    n_threads, rounds = 8, 30
    barrier = threading.Barrier(n_threads)
    bodies: list[tuple[int, int, int]] = []

    def work() -> None:
        barrier.wait()
        for _ in range(rounds):
            with m:
                a = tape.tick()
                with m:  # nested in itself inside a thread
                    pass
                b = tape.tick()
            bodies.append((threading.get_ident(), a, b))

    run_threads(work, [() for _ in range(n_threads)])
    tape.assert_clean()
    assert len(tape.ranges) == 2 * n_threads * rounds
    for tid, a, b in bodies:
        # the outer range of this body: on its thread, started just before it, ended after it
        own = [r for r in tape.ranges.values() if r.thread == tid and r.start < a and b < r.end]  # type: ignore[operator]
        assert own, (tid, a, b)
        closest = max(own, key=lambda r: r.start)
        others = [x for x in bodies if x[0] == tid and x != (tid, a, b)]
        assert not any(closest.start < oa < closest.end for _, oa, _ in others)  # type: ignore[operator]


def test_one_mark_entered_by_interleaved_asyncio_tasks(tape: Tape) -> None:
    m = mark("task_range")
    bodies: dict[int, tuple[int, int]] = {}

    async def task(i: int) -> int:
        with m:
            a = tape.tick()  # no await between __enter__ and this tick
            for _ in range((i * 7) % 5 + 1):  # tasks finish in a shuffled order
                await asyncio.sleep(0)
            b = tape.tick()
        bodies[i] = (a, b)
        return i

    async def main() -> list[int]:
        return list(await asyncio.gather(*(task(i) for i in range(12))))

    assert run(main()) == list(range(12))
    tape.assert_clean()
    spans = {(r.start, r.end) for r in tape.ranges.values()}
    # each range started right before its own body and ended right after it
    assert spans == {(a - 1, b + 1) for a, b in bodies.values()}


def test_one_mark_in_interleaved_generators(tape: Tape) -> None:
    m = mark("g")
    ticks: dict[str, list[int]] = {"x": [], "y": []}

    def gen(key: str) -> Any:
        with m:
            ticks[key].append(tape.tick())
            yield
            ticks[key].append(tape.tick())

    gx, gy = gen("x"), gen("y")
    next(gx)
    next(gy)
    with pytest.raises(StopIteration):
        next(gx)
    with pytest.raises(StopIteration):
        next(gy)
    tape.assert_clean()
    spans = {(r.start, r.end) for r in tape.ranges.values()}
    assert spans == {(t[0] - 1, t[1] + 1) for t in ticks.values()}


def test_decorated_function_called_concurrently_from_tasks(tape: Tape) -> None:
    bodies: list[tuple[int, int]] = []

    @mstx_range("deco_task")
    async def work(i: int) -> None:
        a = tape.tick()
        for _ in range(i % 3 + 1):
            await asyncio.sleep(0)
        bodies.append((a, tape.tick()))

    async def main() -> None:
        await asyncio.gather(*(work(i) for i in range(9)))

    run(main())
    tape.assert_clean()
    assert {(r.start, r.end) for r in tape.ranges.values()} == {(a - 1, b + 1) for a, b in bodies}


# --- enabled / configure after decoration --------------------------------------------------------


def test_configure_reaches_functions_decorated_before(tape: Tape) -> None:
    mstx_marks.core.configuration.reset()  # as at import: nothing resolved yet

    @mstx_range("early", domain="verl")
    def early() -> int:
        return 1

    m = mark("early_mark")
    configure(backend="noop")
    early()
    with m:
        pass
    assert not tape.ranges
    configure(backend=tape)
    early()
    with m:
        pass
    assert [r.name for r in tape.ranges.values()] == ["early", "early_mark"]
    configure(include=["other"])
    early()
    with m:
        pass
    assert len(tape.ranges) == 2


def test_range_started_enabled_ends_after_disable(tape: Tape) -> None:
    m = mark("m")

    @mstx_range("deco")
    def deco() -> None:
        configure(enabled=False)

    with m:
        configure(enabled=False)
    configure(enabled=True)
    deco()
    assert [r.name for r in tape.ranges.values()] == ["m", "deco"]
    tape.assert_clean()


def test_range_started_disabled_never_ends(tape: Tape) -> None:
    configure(enabled=False)
    m = mark("m")

    @mstx_range("deco")
    def deco() -> None:
        configure(enabled=True)

    with m:
        configure(enabled=True)
        configure(enabled=False)
        configure(enabled=True)
    configure(enabled=False)
    deco()
    assert not tape.ranges
    assert not tape.unknown_ends


def test_default_domain_is_filtered_by_include(tape: Tape) -> None:
    configure(include=["verl"])
    with mark("plain"):
        pass
    with mark("named_default", domain="default"):
        pass
    with mark("v", domain="verl"):
        pass
    assert [r.name for r in tape.ranges.values()] == ["v"]


# --- exceptions -----------------------------------------------------------------------------------


class Boom(Exception):
    pass


def _raise_line() -> int:
    return inspect.currentframe().f_back.f_lineno  # type: ignore[union-attr]


def _innermost(exc: BaseException) -> traceback.FrameSummary:
    return traceback.extract_tb(exc.__traceback__)[-1]


def test_user_exception_propagates_unchanged_from_every_kind(tape: Tape) -> None:
    err = Boom("user")
    lines: dict[str, int] = {}

    def body(kind: str) -> None:
        lines[kind] = _raise_line() + 1
        raise err

    @mstx_range("plain")
    def plain() -> None:
        body("plain")

    @mstx_range("coro")
    async def coro() -> None:
        await asyncio.sleep(0)
        body("coro")

    @mstx_range("gen")
    def gen() -> Any:
        yield 1
        body("gen")

    @mstx_range("agen")
    async def agen() -> Any:
        yield 1
        body("agen")

    async def drain_agen() -> None:
        async for _ in agen():
            pass

    def with_block() -> None:
        with mark("with"):
            body("with")

    calls = {
        "plain": plain,
        "coro": lambda: run(coro()),
        "gen": lambda: list(gen()),
        "agen": lambda: run(drain_agen()),
        "with": with_block,
    }
    for kind, call in calls.items():
        with pytest.raises(Boom) as info:
            call()
        assert info.value is err, kind
        frame = _innermost(info.value)
        assert (frame.name, frame.lineno) == ("body", lines[kind]), kind
        assert any(f.name == "body" for f in traceback.extract_tb(info.tb))
    assert [r.name for r in tape.ranges.values()] == list(calls)
    tape.assert_clean()


def test_base_exceptions_also_end_the_range(tape: Tape) -> None:
    @mstx_range("interrupted")
    def f() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        f()
    with pytest.raises(SystemExit), mark("exiting"):
        raise SystemExit(3)
    assert [r.name for r in tape.ranges.values()] == ["interrupted", "exiting"]
    tape.assert_clean()


# --- backend faults -------------------------------------------------------------------------------


def _kinds() -> dict[str, Any]:
    @mstx_range("plain")
    def plain(x: int) -> int:
        return x + 1

    @mstx_range("coro")
    async def coro(x: int) -> int:
        await asyncio.sleep(0)
        return x + 1

    @mstx_range("gen")
    def gen(x: int) -> Any:
        yield x + 1

    @mstx_range("agen")
    async def agen(x: int) -> Any:
        yield x + 1

    async def first(x: int) -> int:
        async for v in agen(x):
            return int(v)
        raise AssertionError

    def with_block(x: int) -> int:
        with mark("with"):
            return x + 1

    return {
        "plain": plain,
        "coro": lambda x: run(coro(x)),
        "gen": lambda x: next(iter(gen(x))),
        "agen": lambda x: run(first(x)),
        "with": with_block,
    }


@pytest.mark.parametrize("kind", ["plain", "coro", "gen", "agen", "with"])
@pytest.mark.parametrize("failing_call", ["start", "end"])
def test_backend_failure_warns_once_and_workload_keeps_running(
    kind: str, failing_call: str
) -> None:
    backend = Failing((failing_call,))
    configure(backend=backend)
    call = _kinds()[kind]
    with caught() as w:
        results = [call(i) for i in range(4)]
    assert results == [1, 2, 3, 4]
    assert len(w) == 1 and w[0].category is mstx_marks.MstxMarksWarning
    assert "'failing'" in str(w[0].message) and "backend broke" in str(w[0].message)
    if kind in ("plain", "with", "gen"):  # the others run from asyncio's frames
        assert w[0].filename == __file__  # the user's line, not one inside the library
    # the failing backend is dropped: later calls never reach it
    assert backend.calls == (["start"] if failing_call == "start" else ["start", "end"])
    assert mstx_marks.current_backend().name == "noop"
    assert not mstx_marks.is_active()


def test_backend_failure_in_end_does_not_mask_the_user_exception() -> None:
    configure(backend=Failing(("end",)))
    err = Boom("mine")
    with caught() as w, pytest.raises(Boom) as info, mark("x"):
        raise err
    assert info.value is err
    assert len(w) == 1


def test_backend_failure_in_instant_warns_once() -> None:
    backend = Failing(("mark",))
    configure(backend=backend)
    with caught() as w:
        for _ in range(3):
            instant("i")
    assert len(w) == 1 and backend.calls == ["mark"]


def test_failure_of_the_first_call_after_reset_is_reported() -> None:
    """Settings resolve at first use; a fault in that very first call must still warn."""
    backend = Failing(("start",))
    PROCESS.settings.explicit["backend"] = backend  # as if chosen by env

    @mstx_range("first")
    def f() -> int:
        return 7

    with caught() as w:
        assert f() == 7
    assert len(w) == 1 and "backend broke" in str(w[0].message)
    assert mstx_marks.current_backend().name == "noop"


# --- pickling and processes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [double_it, triple, quadruple, Worker.static_below, Worker.static_above],
    ids=lambda f: f.__qualname__,
)
def test_module_level_decorated_functions_pickle_to_themselves(obj: Any) -> None:
    assert pickle.loads(pickle.dumps(obj)) is obj


def test_methods_pickle_and_still_record(recorder: mstx_marks.Recorder) -> None:
    bound = pickle.loads(pickle.dumps(Worker(10).add))
    cls_bound = pickle.loads(pickle.dumps(Worker.cls_below))
    part = pickle.loads(pickle.dumps(functools.partial(triple, 2)))
    assert (bound(1), cls_bound(3), part()) == (11, "Worker3", 6)
    assert [r.name for r in recorder.records()] == ["Worker.add", "cls_below", "triple"]


def test_mark_objects_pickle_as_fresh_marks(recorder: mstx_marks.Recorder) -> None:
    m = mark("p", domain="verl")
    with m:
        copy = pickle.loads(pickle.dumps(m))
    assert (copy.name, copy.domain) == ("p", "verl")
    with copy:
        pass
    assert names(recorder) == [("p", "verl", "range")] * 2
    assert all(r.end_ns is not None for r in recorder.records())


def _spawned(conn: Any, x: int, decorated: Any) -> None:
    conn.send((run_in_child(x), decorated(2)))
    conn.close()


def test_spawned_child_runs_and_records(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    ctx = multiprocessing.get_context("spawn")
    # A Process and a pipe, not a Pool: a Pool whose worker dies waits for ever; this fails
    # within a bound, with the child's exit code.
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_spawned, args=(sender, 5, triple))  # triple travels pickled
    child.start()
    sender.close()
    try:
        assert receiver.poll(120), f"the child sent nothing (exit code {child.exitcode})"
        (result, pid, recs), via_pickle = receiver.recv()
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert (result, via_pickle) == (15, 6)
    assert pid != os.getpid()
    assert recs == [("child_work", "verl", "range", True, pid)]
    assert not default_recorder().records()  # nothing ran here


def test_start_and_end_from_different_functions_pair_while_nested(tape: Tape) -> None:
    # What forward pre/post hooks need, and what __enter__/__exit__ cannot give (test above).
    m = mark("hooks")
    open_ranges: list[Any] = []

    def pre_hook() -> None:
        open_ranges.append(m.start())

    def post_hook() -> None:
        open_ranges.pop().end()

    with m:
        pre_hook()
        b = tape.tick()
        post_hook()
        c = tape.tick()
    outer, inner = sorted(tape.ranges.values(), key=lambda r: r.start)
    assert inner.start < b < inner.end < c < outer.end  # type: ignore[operator]


def test_a_started_range_ends_once_from_another_thread(tape: Tape) -> None:
    r = mark("handed_over", domain="verl").start()
    worker = threading.Thread(target=r.end)
    worker.start()
    worker.join()
    r.end()  # a second end does nothing
    (only,) = tape.ranges.values()
    assert only.domain == only.end_domain == "verl" and only.ends == 1


def test_a_backend_saying_not_recorded_with_none_keeps_entries_paired() -> None:
    # None is a falsy handle ("not recorded"); it must not look like a free slot to re-entries.
    from mstx_marks.backends.base import Backend, Emitter

    calls: list[tuple[str, Any]] = []
    handles = iter([None, 7])

    class Sometimes(Backend):
        name = "sometimes"

        def emitter(self, stream: object) -> Emitter:
            def start(name: str, domain: str) -> Any:
                handle = next(handles)
                calls.append(("start", handle))
                return handle

            return Emitter(self, start, lambda h, d: calls.append(("end", h)), lambda n, d: None)

    configure(backend=Sometimes())
    m = mark("sometimes")

    def other_flow() -> Iterator[None]:
        with m:  # recorded as 7, entered while the first entry is open
            yield

    flow = other_flow()
    with m:  # not recorded
        next(flow)
    calls.append(("first entry left", None))
    next(flow, None)
    assert calls == [("start", None), ("start", 7), ("first entry left", None), ("end", 7)]


# --- the timing bridge (verl's marked_timer has no finally) ------------------------------------


def test_timing_adds_the_seconds_and_the_range_even_when_the_block_raises(
    recorder: mstx_marks.Recorder,
) -> None:
    from mstx_marks import marked_timer

    timing_raw = {"gen": 1.0}
    with pytest.raises(ZeroDivisionError), mark("gen", timing=timing_raw):
        1 / 0  # noqa: B018
    assert timing_raw["gen"] > 1.0  # accumulated, as verl's timer does
    with marked_timer("update_actor", timing_raw, color="red"):
        pass
    assert set(timing_raw) == {"gen", "update_actor"}
    ranges = [r for r in recorder.records() if r.kind == "range"]
    assert [r.name for r in ranges] == ["gen", "update_actor"]
    assert all(not r.open for r in ranges)  # both ended, the raising one included
