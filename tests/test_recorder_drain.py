"""The drain's contract (backends/record.py): it never waits on a start that has not finished.

A start interrupted between taking its slot and writing its key (another thread between two
statements, a signal handler running on top of it, an exception that cut it short) must hold back
nothing recorded after it, and every event must come out of the drains exactly once, whatever
the interleaving of starts, ends, unfinished starts, their late completion and drains (with and
without freeing chunks).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mstx_marks.backends import record
from mstx_marks.backends.record import DrainCursor, Recorder


def _reserve(rec: Recorder) -> int:
    """Take a slot as range_start does and stop before its key: an interrupted start."""
    i = next(rec._next)
    chunk = i >> record._SHIFT
    if len(rec._starts) <= chunk:
        rec._grow(chunk)
    return i


def _finish(rec: Recorder, i: int, name: str) -> int:
    """Complete a reserved start (what the interrupted start does once it resumes)."""
    chunk, off = i >> record._SHIFT, i & record._MASK
    rec._tids[chunk][off] = record._thread_number()
    rec._starts[chunk][off] = record.now_ns()
    rec._keys[chunk][off] = rec._new_key(name, "d")
    return rec._base + i + 1


ops = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(0, 3)),
        st.tuples(st.just("reserve"), st.integers(0, 3)),
        st.tuples(st.just("finish"), st.integers(0, 50)),
        st.tuples(st.just("end"), st.integers(0, 50)),
        st.tuples(st.just("drain"), st.booleans()),
        st.tuples(st.just("burst"), st.sampled_from([1, 100, record._CHUNK])),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_every_event_is_drained_once_and_none_waits_on_an_unfinished_start(
    steps: list[tuple[str, Any]],
) -> None:
    rec, cursor = Recorder(capacity=1 << 20), DrainCursor()
    open_ids: list[int] = []
    reserved: list[int] = []
    completed: dict[int, str] = {}  # range id -> name, once its event is complete
    drained: list[tuple[str, int]] = []

    def drain(release: bool) -> None:
        blocks, events = rec.drain_blocks(cursor, release=release)
        got: list[Any] = []
        for b in blocks:
            record.block_records(b, rec._names, record._threads, rec.pid, got.append)
        drained.extend((r.name, r.start_ns) for r in [*got, *events])

    for serial, (op, arg) in enumerate(steps, 1):
        if op == "start":
            name = f"n{arg}_{serial}"
            rid = rec.range_start(name, "d")
            open_ids.append(rid)
            completed[rid] = name
        elif op == "reserve":
            reserved.append(_reserve(rec))
        elif op == "finish" and reserved:
            i = reserved.pop(arg % len(reserved))
            name = f"late{serial}"
            rid = _finish(rec, i, name)
            open_ids.append(rid)
            completed[rid] = name
        elif op == "end" and open_ids:
            rec.range_end(open_ids.pop(arg % len(open_ids)), "d")
        elif op == "drain":
            drain(arg)
        elif op == "burst":
            for _ in range(arg):  # enough to fill chunks and make the drain free them
                rec.instant("i", "d")
            completed[-serial] = "i"
    for rid in open_ids:
        rec.range_end(rid, "d")
    drain(True)
    names = [n for n, _ in drained]
    # Exactly once: no event twice (an unfinished slot's end reads as "open": it must not be
    # taken for an open range as well)...
    assert len(set(drained)) == len(drained)
    # ...and every completed range is there, though unfinished starts remain before them.
    expected = sorted(n for n in completed.values() if n != "i")
    assert sorted(n for n in names if n != "i") == expected
    assert rec.unfinished(cursor) == len(reserved)


def test_an_unfinished_start_is_given_up_after_the_bound_and_frees_its_chunk() -> None:
    rec, cursor = Recorder(capacity=record._CHUNK * 2), DrainCursor()
    i = _reserve(rec)
    for _ in range(record._CHUNK):  # past the first chunk
        rec.instant("i", "d")
    rec.drain_blocks(cursor, release=True)
    assert rec.unfinished(cursor) == 1 and rec.given_up == 0
    assert cursor.pinned == [0]  # kept while the start may still finish
    cursor.unfinished[i] -= record.UNFINISHED_NS + 1  # as if first seen that long ago
    rec.drain_blocks(cursor, release=True)
    assert rec.unfinished(cursor) == 0 and rec.given_up == 1
    assert cursor.pinned == []  # freed; a late completion lands in scratch columns
    _finish(rec, i, "too_late")  # does not raise into the user's code
    assert "too_late" not in [r.name for r in rec.drain(cursor)]


def test_slots_dropped_before_the_first_release_are_not_taken_for_unfinished_starts() -> None:
    # A recorder that filled before its spill first drained it: the slots past its capacity were
    # dropped and will never be written. The drain that switches to freeing chunks must step
    # over them as dropped, neither waiting on them nor keeping them as unfinished.
    rec, cursor = Recorder(capacity=40_000), DrainCursor()
    for _ in range(50_000):
        rec.instant("early", "d")
    assert rec.dropped == 10_000
    first = rec.drain(cursor, release=True)
    for _ in range(30_000):
        rec.instant("later", "d")
    later = rec.drain(cursor, release=True)
    assert [len(first), len(later)] == [40_000, 30_000]
    assert rec.unfinished(cursor) == 0 and rec.given_up == 0
