"""Sampling policies: which calls of a target are marked, per target, under threads, and cheaply."""

from __future__ import annotations

import pickle
import threading
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.threads import run_threads

import mstx_marks
from mstx_marks import configure, every, first, instant, mark, mstx_range, window
from mstx_marks.core import sampling
from mstx_marks.core.sampling import Policy

# --- policies as sets of indices ----------------------------------------------------------------

counts = st.integers(min_value=0, max_value=300)


@st.composite
def policies(draw: st.DrawFn, depth: int = 2) -> tuple[Policy, Callable[[int], bool]]:
    """A random policy, with the membership rule it must implement."""
    kind = draw(st.sampled_from(["every", "first", "window", "and", "or"] if depth else ["every"]))
    if kind == "every":
        n = draw(st.integers(1, 50))
        return every(n), lambda i: i % n == 0
    if kind == "first":
        k = draw(st.integers(0, 100))
        return first(k), lambda i: i < k
    if kind == "window":
        start = draw(st.integers(0, 150))
        stop = draw(st.integers(start + 1, start + 150))
        return window(start, stop), lambda i: start <= i < stop
    (p, p_in), (q, q_in) = draw(policies(depth - 1)), draw(policies(depth - 1))
    if kind == "and":
        return p & q, lambda i: p_in(i) and q_in(i)
    return p | q, lambda i: p_in(i) or q_in(i)


@given(policies(), counts)
def test_a_policy_marks_exactly_its_indices(drawn: tuple[Policy, Any], calls: int) -> None:
    policy, member = drawn
    assert policy.indices(calls) == [i for i in range(calls) if member(i)]
    stream = policy.decisions()
    assert [next(stream) for _ in range(calls)] == [member(i) for i in range(calls)]


@given(st.integers(1, 40), st.integers(0, 40), st.integers(0, 60), st.integers(1, 60), counts)
def test_basic_policies_and_composition_are_set_operations(
    n: int, k: int, start: int, width: int, calls: int
) -> None:
    e, f, w = every(n), first(k), window(start, start + width)
    assert e.indices(calls) == list(range(0, calls, n))
    assert f.indices(calls) == list(range(min(k, calls)))
    assert w.indices(calls) == list(range(start, min(start + width, calls)))
    assert (e & w).indices(calls) == sorted(set(e.indices(calls)) & set(w.indices(calls)))
    assert (f | w).indices(calls) == sorted(set(f.indices(calls)) | set(w.indices(calls)))


def test_window_has_verl_profile_token_meaning() -> None:
    # profile_token_start=30, profile_token_end=70: steps 30..69, 0-based, end exclusive.
    assert window(30, 70).indices(200) == list(range(30, 70))
    assert repr(every(2) & (first(3) | window(5, 9))) == "(every(2) & (first(3) | window(5, 9)))"


def test_every_holds_constant_memory_for_huge_periods() -> None:
    stream = every(10**12).decisions()
    assert [next(stream) for _ in range(3)] == [True, False, False]


@settings(max_examples=10)
@given(st.integers(sampling._CYCLE_MAX - 2, sampling._CYCLE_MAX + 3))
def test_every_is_the_same_on_both_sides_of_the_cycle_limit(n: int) -> None:
    assert every(n).indices(3 * n + 1) == [0, n, 2 * n, 3 * n]


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: every(0), ValueError, "every(n): n must be >= 1, got 0"),
        (lambda: every(-3), ValueError, "every(n): n must be >= 1, got -3"),
        (lambda: every(2.0), TypeError, "every(n): n must be an int, got float 2.0"),
        (lambda: every(True), TypeError, "every(n): n must be an int, got bool True"),
        (lambda: first(-1), ValueError, "first(k): k must be >= 0, got -1"),
        (lambda: window(-1, 5), ValueError, "start must be >= 0, got -1"),
        (lambda: window(5, 5), ValueError, "stop must be > start, got start=5, stop=5"),
        (lambda: window(6, 5), ValueError, "stop must be > start, got start=6, stop=5"),
        (lambda: window(0, "9"), TypeError, "stop must be an int"),
        (lambda: every(2) & 3, TypeError, "cannot combine a sampling policy with 3"),
        (lambda: first(1) | None, TypeError, "cannot combine a sampling policy with None"),
        (lambda: mark("x", sample=5), TypeError, "sampling policy"),
        (lambda: mstx_range("x", sample="every 2"), TypeError, "sampling policy"),
    ],
)
def test_invalid_policies_fail_at_definition(
    make: Callable[[], object], error: type, message: str
) -> None:
    with pytest.raises(error) as info:
        make()
    assert message in str(info.value)


# --- policies applied to targets --------------------------------------------------------------


def marked_calls(records: list[mstx_marks.RangeRecord]) -> list[int]:
    """Call numbers whose range was recorded: each call emits instant "call<i>" inside its range,
    and records come in start order, so a range is followed by its call's instant."""
    return [int(records[i + 1].name[4:]) for i, r in enumerate(records) if r.kind == "range"]


@settings(max_examples=30, deadline=None)
@given(policies(), st.integers(0, 120))
def test_a_decorated_function_marks_exactly_the_policy_indices(
    drawn: tuple[Policy, Any], calls: int
) -> None:
    configure(backend="record")
    recorder = mstx_marks.default_recorder()
    recorder.clear()
    policy, _ = drawn

    @mstx_range("hot", sample=policy)
    def hot(i: int) -> int:
        instant(f"call{i}")
        return i

    assert [hot(i) for i in range(calls)] == list(range(calls))
    assert marked_calls(recorder.records()) == policy.indices(calls)


def test_each_target_and_each_with_site_counts_its_own_calls(
    recorder: mstx_marks.Recorder,
) -> None:
    site = mark("shared", sample=first(2))
    a, b = site(lambda: None), site(lambda: None)
    for _ in range(5):
        a()
        b()
        with site:
            pass
    assert len(recorder.records()) == 6  # 2 for a, 2 for b, 2 for the with site


def test_a_sampled_generator_and_coroutine_count_runs(recorder: mstx_marks.Recorder) -> None:
    @mstx_range("gen", sample=every(2))
    def gen() -> Any:
        yield 1

    for _ in range(5):
        assert list(gen()) == [1]
    assert len(recorder.records()) == 3


@pytest.mark.parametrize("policy", [every(7), window(1_000, 3_000), first(5) | every(100)])
def test_concurrent_calls_consume_the_counter_exactly_once_each(
    policy: Policy, recorder: mstx_marks.Recorder
) -> None:
    threads, per_thread = 16, 400
    total = threads * per_thread

    @mstx_range("hot", sample=policy)
    def hot() -> None:
        pass

    barrier = threading.Barrier(threads)

    def worker() -> None:
        barrier.wait()
        for _ in range(per_thread):
            hot()

    run_threads(worker, [() for _ in range(threads)])
    assert len(recorder.records()) == len(policy.indices(total))
    # No decision was lost or taken twice: single-threaded calls continue at index `total`.
    recorder.clear()
    more = 1_000
    for _ in range(more):
        hot()
    expected = [i for i in policy.indices(total + more) if i >= total]
    assert len(recorder.records()) == len(expected)


def test_pickled_targets_restart_their_counter(recorder: mstx_marks.Recorder) -> None:
    site = mark("pickled", sample=first(1))
    with site:
        pass
    clone = pickle.loads(pickle.dumps(site))
    with clone:
        pass
    with site:
        pass
    assert len(recorder.records()) == 2
    composed = pickle.loads(pickle.dumps(every(2) & (first(3) | window(6, 7))))
    assert (repr(composed), composed.indices(10)) == (
        "(every(2) & (first(3) | window(6, 7)))",
        [0, 2, 6],
    )
    stream = every(3).decisions()
    next(stream)
    assert [next(pickle.loads(pickle.dumps(stream))) for _ in range(2)] == [True, True]


def test_deep_parentheses_are_a_clear_error_not_a_recursion_error() -> None:
    from mstx_marks.core.sampling import MAX_DEPTH, parse_policy

    ok = "(" * MAX_DEPTH + "every(2)" + ")" * MAX_DEPTH
    assert parse_policy(ok).indices(5) == [0, 2, 4]
    deep = "(" * 100_000 + "every(2)" + ")" * 100_000
    with pytest.raises(ValueError, match=f"deeper than {MAX_DEPTH}") as err:
        parse_policy(deep)
    assert len(str(err.value)) < 300  # the value is cut, not repeated whole


def test_a_sampled_mark_written_at_each_use_samples_per_call_site() -> None:
    """`with mark(name, sample=every(10))` in a loop keeps one counter per line, as a prebuilt
    mark would (it used to build a new mark, and so record, at every use)."""
    from mstx_marks import configure, default_recorder, every, mark

    configure(backend="record")
    default_recorder().clear()
    for _ in range(100):
        with mark("per_use", sample=every(10)):
            pass
        with mark("per_use", sample=every(25)):  # another line: its own counter, its own policy
            pass
    names = [r.name for r in default_recorder().records()]
    assert names.count("per_use") == 10 + 4
