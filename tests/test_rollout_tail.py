"""The rollout long tail of each RL step (analysis/model/batches.py, rl_steps.py's
``RolloutTail``): a
trainer and four vLLM engines, one slow, one whose ranges carry no args, a step no engine ran
in; the counts merged across parts and files; its invariants under hypothesis."""

from __future__ import annotations

import json
import pickle
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mstx_marks.analysis.model.batches import Batches
from mstx_marks.analysis.model.rl_steps import StepAnalysis, analyse
from mstx_marks.analysis.model.spans import ProcessSpans
from mstx_marks.analysis.model.steps import Step
from mstx_marks.analysis.readers import stream
from mstx_marks.analysis.render.rl_steps_text import format_steps, steps_json
from mstx_marks.analysis.summary import summarize, summarize_path
from mstx_marks.base.records import Member, RangeRecord, RankTrace, Record

MS = 10**6
TRAINER = Member("TaskRunner", 0)
ENGINES = [Member("VllmWorker", k) for k in range(4)]
#: Decode steps per engine in step 1: rank 3 the slow one (the long tail).
DECODES = [40, 38, 39, 52]
#: The engine whose ranges carry no args (a reader, or a preset, that kept none).
NO_ARGS = 2
PREFILL_TOKENS, REQS = 100, 4


def _engine_ranges(k: int) -> list[tuple[str, int, int, dict[str, int] | None]]:
    """Step 1's rollout of engine ``k``: a 20 ms prefill, then its decode steps of 10 ms, 2 ms
    apart."""
    args = k != NO_ARGS
    out: list[tuple[str, int, int, dict[str, int] | None]] = [
        ("prefill_batch", 0, 20 * MS, {"reqs": REQS, "tokens": PREFILL_TOKENS} if args else None)
    ]
    for j in range(DECODES[k]):
        start = 20 * MS + j * 12 * MS
        out.append(
            (
                "decode_batch",
                start,
                start + 10 * MS,
                {"reqs": REQS, "tokens": REQS} if args else None,
            )
        )
    return out


def _traces() -> list[RankTrace]:
    """Steps of 1 s; the engines run in step 1 and not in steps 2 and 3."""
    trainer: list[Record] = [
        RangeRecord("step", "default", i * 1000 * MS, (i + 1) * 1000 * MS, 1, 1) for i in range(3)
    ]
    trainer += [RangeRecord("gen", "default", 0, 900 * MS, 1, 1)]
    traces = [RankTrace(0, trainer, role=TRAINER.role)]
    for k, m in enumerate(ENGINES):
        records: list[Record] = [
            RangeRecord(name, "default", s, e, 1, 10 + k, args=a)
            for name, s, e, a in _engine_ranges(k)
        ]
        traces.append(RankTrace(m.rank, records, role=m.role))
    return traces


def _model() -> StepAnalysis:
    model = summarize(_traces()).per_step
    assert model is not None
    return model


def _rollout_ms(k: int) -> int:
    return 20 + 10 * DECODES[k]


def test_the_slowest_engine_against_the_median() -> None:
    tail = _model().steps[0].tail
    assert tail is not None
    assert [e.member for e in tail.engines] == ENGINES
    assert tail.slowest == ENGINES[3]
    assert tail.slowest_ns == _rollout_ms(3) * MS == 540 * MS
    assert tail.median_ns == statistics.median(_rollout_ms(k) for k in range(4)) * MS == 415 * MS
    assert tail.waiting_share == (540 - 415) / 540


def test_each_engines_decode_steps_tokens_and_requests() -> None:
    tail = _model().steps[0].tail
    assert tail is not None
    assert [e.decode_steps for e in tail.engines] == DECODES
    assert [e.model_steps for e in tail.engines] == [n + 1 for n in DECODES]
    assert [e.decode_ns for e in tail.engines] == [10 * MS * n for n in DECODES]
    assert [e.tokens for e in tail.engines] == [
        None if k == NO_ARGS else PREFILL_TOKENS + REQS * DECODES[k] for k in range(4)
    ]
    assert [e.reqs for e in tail.engines] == [
        None if k == NO_ARGS else REQS * (DECODES[k] + 1) for k in range(4)
    ]


def test_steps_no_engine_ran_in_have_no_tail() -> None:
    model = _model()
    assert [s.tail is None for s in model.steps] == [False, True, True]


def test_the_table_and_the_json_show_it() -> None:
    model = _model()
    lines = [line for line in format_steps(model) if "rollout long tail" in line]
    assert lines == [
        "  rollout long tail: 4 engines, slowest VllmWorker rank 3 540.000 ms vs median"
        " 415.000 ms (23 % of the rollout waiting for it); decode steps 40/38/39/52, tokens"
        " 260/252/not known/308"
    ]
    doc = steps_json(model)["steps"]
    assert doc[1]["rollout_tail"] is None
    tail = doc[0]["rollout_tail"]
    assert tail["slowest"]["rank"] == 3 and tail["median_ns"] == 415 * MS
    assert [e["decode_steps"] for e in tail["engines"]] == DECODES
    assert tail["engines"][NO_ARGS]["tokens"] is None


@pytest.mark.parametrize("held", [True, False], ids=["held", "one-pass"])
def test_spills_give_the_same_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: bool
) -> None:
    """Read from spills (the ranges' args on their lines), held or in one pass: the tail made
    from memory, tokens included."""
    for n, trace in enumerate(_traces()):
        header = {
            "mstx_marks_spill": 2, "pid": n + 1, "host": "a", "rank": trace.rank,
            "role": trace.role, "run": "r1", "instance": "", "wall_ns": 0, "mono_ns": 0,
            "anchor_ns": 0,
        }  # fmt: skip
        lines = [json.dumps(header)]
        for r in trace.records:
            assert isinstance(r, RangeRecord)
            line = ["r", r.name, r.domain, r.start_ns, r.end_ns, r.thread]
            lines.append(json.dumps([*line, dict(r.args)] if r.args else line))
        lines.append(json.dumps({"complete": True}))
        path = tmp_path / "spill" / f"a-{n + 1}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    if not held:
        monkeypatch.setattr(stream, "MAX_HELD_EVENTS", 0)
    summary = summarize_path(tmp_path, jobs=1, progress=False)
    assert summary.errors == [] and summary.per_step is not None
    got = [s["rollout_tail"] for s in steps_json(summary.per_step)["steps"]]
    assert got == [s["rollout_tail"] for s in steps_json(_model())["steps"]]
    assert got[0] is not None and got[0]["engines"][0]["tokens"] == PREFILL_TOKENS + REQS * 40


def test_parts_of_one_engine_merge_to_the_whole() -> None:
    """An engine read in two parts (two files, or two nodes' workers shipping pickled parts):
    the counts are those of one read."""
    ranges = _engine_ranges(3)
    whole, first, second = ProcessSpans(), ProcessSpans(), ProcessSpans()
    for n, (name, s, e, a) in enumerate(ranges):
        whole.add(s, e, name, a)
        (first if n % 2 else second).add(s, e, name, a)
    parts = [pickle.loads(pickle.dumps(p.finish())) for p in (first, second)]
    merged = parts[1].merge(parts[0]).finish()
    assert merged.batches.runs() == whole.finish().batches.runs()
    assert sum(r[3] for r in merged.batches.runs()) == DECODES[3]


def test_many_model_steps_stay_bounded_and_counted() -> None:
    """A long rollout's ranges are joined to bound memory, its steps' counts still exact: the
    gaps between rollouts are the widest, joined last."""
    b = Batches()
    per_step, steps = 3000, 20
    for i in range(steps):
        for j in range(per_step):
            start = i * 10**9 + j * 100_000
            b.add(start, start + 90_000, "decode_batch", {"reqs": 2, "tokens": 2})
    b.finish()
    assert len(b) <= 2048
    counts = b.clip([(i * 10**9, (i + 1) * 10**9) for i in range(steps)])
    assert list(counts.decode) == [per_step] * steps
    assert list(counts.tokens) == [2 * per_step] * steps
    assert counts.cut == 0


_engine_steps = st.lists(
    st.lists(st.tuples(st.integers(0, 2999), st.integers(1, 200), st.booleans()), max_size=30),
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(_engine_steps)
def test_the_tail_holds_its_invariants(engines: list[list[tuple[int, int, bool]]]) -> None:
    """Share in [0, 1), the slowest at least the median, decode counts summing to the decode
    ranges inside each step."""
    trainer = ProcessSpans()
    trainer.add(0, 3000, "gen")
    trainer.set_steps([Step(i * 1000, (i + 1) * 1000, str(i + 1), 1000) for i in range(3)])
    procs = [(TRAINER, trainer.finish())]
    inside = [0, 0, 0]
    for k, ranges in enumerate(engines):
        p = ProcessSpans()
        for start, length, decode in ranges:
            end = min(start + length, (start // 1000 + 1) * 1000)  # (within its step)
            p.add(start, end, "decode_batch" if decode else "prefill_batch", {"tokens": 1})
            inside[start // 1000] += decode
        procs.append((Member("VllmWorker", k), p.finish()))
    model = analyse(procs)
    assert model is not None
    for i, step in enumerate(model.steps):
        tail = step.tail
        if tail is None:
            assert inside[i] == 0
            continue
        assert 0 <= tail.waiting_share < 1
        assert tail.slowest_ns >= tail.median_ns
        assert sum(e.decode_steps for e in tail.engines) == inside[i]
        assert all(e.tokens == e.model_steps for e in tail.engines)


_ranges = st.lists(
    st.tuples(st.integers(0, 999), st.integers(0, 50), st.booleans(), st.booleans()),
    max_size=60,
)


@settings(max_examples=80, deadline=None)
@given(_ranges, st.integers(0, 60))
def test_counts_in_any_order_and_parts_are_each_ranges_by_its_middle(
    ranges: list[tuple[int, int, bool, bool]], cut: int
) -> None:
    """Ranges added in any order, in two parts merged: each counted once, in the window holding
    its middle (no run joined at this size), tokens only from those that carried them."""
    parts = [Batches(), Batches()]
    for n, (start, length, decode, args) in enumerate(ranges):
        phase = "decode_batch" if decode else "prefill_batch"
        parts[n >= cut].add(start, start + length, phase, {"tokens": 3} if args else None)
    b = parts[0].merge(parts[1])
    windows = [(0, 300), (300, 700), (700, 1100)]
    got = b.clip(windows)
    for w, (lo, hi) in enumerate(windows):
        here = [r for r in ranges if lo <= (2 * r[0] + r[1]) // 2 < hi]
        assert got.model_steps[w] == len(here)
        assert got.decode[w] == sum(r[2] for r in here)
        assert got.known[w] == sum(r[3] for r in here)
        assert got.tokens[w] == 3 * got.known[w]
