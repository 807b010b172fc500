"""Where each RL step's time goes across processes (analysis/model/spans.py, rl_steps.py): a
synthetic
job of a trainer, two FSDP workers and a rollout engine on two hosts, read from memory, from
spills and in one pass; and the attribution's invariants under hypothesis."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.oracle import covered

from mstx_marks.analysis.model.batches import Batches
from mstx_marks.analysis.model.rl_steps import StepAnalysis, analyse, fences_needed
from mstx_marks.analysis.model.spans import ProcessSpans, SpanSet
from mstx_marks.analysis.model.steps import Step
from mstx_marks.analysis.readers import stream
from mstx_marks.analysis.render.rl_steps_text import format_steps, steps_json
from mstx_marks.analysis.summary import format_json, format_table, summarize, summarize_path
from mstx_marks.base.records import Member, RangeRecord, RankTrace

MS = 10**6
T0 = 1_750_000_000_000_000_000
ANCHOR_A = 1_749_000_000_000_000_000  # host a: wall less monotonic
ANCHOR_B = 1_748_000_000_000_000_000  # host b: another boot
NTP_STEP = 50 * MS  # the wall clock of host a was stepped before one worker started
SKEW_B = 3 * MS  # host b's wall clock runs 3 ms ahead of host a's

TRAINER = Member("TaskRunner", 0)
WORKER0, WORKER1 = Member("WorkerDict", 0), Member("WorkerDict", 1)
ENGINE = Member("EngineCore_DP0", 0)

# (process, name, start ms, end ms) in true time (host a's clock), step 1 then step 2 (+100 ms)
_STEP = [
    (TRAINER, "step", 0, 100),
    (TRAINER, "gen", 0, 40),
    (TRAINER, "old_log_prob", 40, 55),
    (TRAINER, "update_actor", 55, 95),
    (ENGINE, "vllm_one_step", 2, 10),
    (ENGINE, "vllm_one_step", 12, 20),
    (ENGINE, "vllm_one_step", 22, 30),
    (ENGINE, "vllm_one_step", 32, 38),
    (WORKER0, "compute_log_prob", 41, 54),
    (WORKER0, "update_actor", 56, 90),
    (WORKER1, "compute_log_prob", 41, 53),
    (WORKER1, "update_actor", 56, 94),
]
# A range over the edge of the two steps: 2 ms in step 1, 3 ms in step 2.
_ACROSS = (WORKER1, "update_weights", 98, 103)


def _job() -> list[tuple[Member, str, int, int]]:
    ranges = [(m, n, s, e) for m, n, s, e in _STEP]
    ranges += [(m, n, s + 100, e + 100) for m, n, s, e in _STEP]
    return [*ranges, _ACROSS]


def _where(member: Member) -> tuple[str, int, int]:
    """(host, anchor, how far its recorded times are from true time)."""
    if member == ENGINE:
        return "b", ANCHOR_B, SKEW_B
    if member == WORKER0:
        return "a", ANCHOR_A + NTP_STEP, NTP_STEP
    return "a", ANCHOR_A, 0


def job_traces() -> list[RankTrace]:
    """The job as each process recorded it: on the wall clock's axis by its own anchor."""
    by_member: dict[Member, list[RangeRecord]] = {}
    for m, name, s, e in _job():
        _, _, off = _where(m)
        pid = 100 + [TRAINER, WORKER0, WORKER1, ENGINE].index(m)
        rec = RangeRecord(name, "default", T0 + s * MS + off, T0 + e * MS + off, 1, pid)
        by_member.setdefault(m, []).append(rec)
    traces = []
    for m, records in by_member.items():
        host, anchor, _ = _where(m)
        records.sort(key=lambda r: r.start_ns)
        traces.append(RankTrace(m.rank, records, role=m.role, host=host, anchor_ns=anchor))
    return traces


def _write_spill(folder: Path, trace: RankTrace) -> Path:
    """The trace as the flight recorder's spill (one line a range), with its host and anchor."""
    pid = trace.records[0].pid
    header = {
        "mstx_marks_spill": 2, "pid": pid, "host": trace.host, "rank": trace.rank,
        "role": trace.role, "run": "r1", "instance": "", "wall_ns": 0, "mono_ns": 0,
        "anchor_ns": trace.anchor_ns,
    }  # fmt: skip
    lines = [json.dumps(header)]
    lines += [
        json.dumps(["r", r.name, r.domain, r.start_ns, r.end_ns, r.thread]) for r in trace.records
    ]
    lines.append(json.dumps({"complete": True}))
    path = folder / "spill" / f"{trace.host}-{pid}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _model() -> StepAnalysis:
    model = summarize(job_traces()).per_step
    assert model is not None
    return model


def test_the_trainers_steps_are_the_jobs_steps() -> None:
    model = _model()
    assert model.reference == TRAINER and model.loop_role == "TaskRunner"
    assert [(s.key, s.length_ns) for s in model.steps] == [("1", 100 * MS), ("2", 100 * MS)]


def test_each_process_is_attributed_to_the_trainers_steps_by_time() -> None:
    model = _model()
    w0, w1, engine = model.row(WORKER0), model.row(WORKER1), model.row(ENGINE)
    for i in (0, 1):
        assert w0.busy_ns[i] == (13 + 34) * MS  # on its host's one clock: exact
        assert w0.phases["update_actor"][i] == 34 * MS
        assert engine.phases["vllm_one_step"][i] == 30 * MS
        assert w0.idle_ns(i) == w0.length_ns[i] - w0.busy_ns[i] == 53 * MS
    # the FSDP worker is idle through the rollout: its idle holds the trainer's gen
    assert all(w0.idle_ns(i) >= model.row(TRAINER).phases["generate_sequences"][i] for i in (0, 1))
    assert (w1.phases["update_weights"][0], w1.phases["update_weights"][1]) == (2 * MS, 3 * MS)


def test_a_range_over_a_steps_edge_is_split_and_counted() -> None:
    model = _model()
    assert model.row(WORKER1).split == {"update_weights": 1}
    assert model.split == 1
    assert "1 phase span crossed a step's edge and was split between the steps" in format_steps(
        model
    )


def test_one_hosts_processes_share_its_monotonic_clock() -> None:
    """The worker whose process began after the wall clock was stepped is moved back onto its
    host's anchor; the other host is only as close as its wall clock, which the note says."""
    model = _model()
    assert model.clock.shifts_ns == {WORKER0: -NTP_STEP}
    assert model.clock.hosts == ["a", "b"]
    assert model.clock.aligned_by == "wall"
    # (no call of host b's nests in one of the trainer's: its offset is not measured, and said)
    assert "b: not measured (no nested calls), placed by its wall clock" in model.clock.text()
    assert "clocks: 2 machines: a (the reference's), b: not measured" in format_table(
        summarize(job_traces())
    )
    # without its anchor the worker's update_actor of step 1 would sit 50 ms late, half in step 2
    unanchored = [
        RankTrace(t.rank, t.records, role=t.role, host=t.host) if t.member == WORKER0 else t
        for t in job_traces()
    ]
    late = summarize(unanchored).per_step
    assert late is not None and late.row(WORKER0).busy_ns[0] != 47 * MS


def test_the_other_hosts_skew_moves_its_figures_by_at_most_the_skew() -> None:
    """Host b runs 3 ms ahead: what it did is attributed as if 3 ms late, no more."""
    model = _model()
    engine = model.row(ENGINE)
    truth = 30 * MS
    for i in (0, 1):
        assert abs(engine.busy_ns[i] - truth) <= 2 * SKEW_B


def test_the_critical_path_names_who_each_phase_waited_for() -> None:
    step = _model().steps[0]
    got = [(link.phase, link.time_ns, link.waited, link.waited_phase) for link in step.path]
    assert got == [
        ("generate_sequences", 40 * MS, ENGINE, "vllm_one_step"),
        ("compute_log_prob", 15 * MS, WORKER0, "compute_log_prob"),
        ("update_actor", 40 * MS, WORKER1, "update_actor"),
    ]


def test_what_the_step_would_take_if_the_slowest_rank_matched_the_median() -> None:
    what = _model().steps[0].what_if
    assert what is not None
    assert (what.role, what.phase, what.slowest_rank) == ("WorkerDict", "update_actor", 1)
    assert what.saving_ns == (38 - 36) * MS and what.step_ns == 98 * MS


def test_the_summary_prints_and_writes_the_per_step_table() -> None:
    summary = summarize(job_traces())
    text = format_table(summary)
    assert "per step: steps of TaskRunner rank 0 (2 in all)" in text
    assert "critical path: generate_sequences 40.000 (last: EngineCore_DP0 rank 0" in text
    assert "if the slowest rank matched the median: 98.000 ms, 2.000 less" in text
    doc = format_json(summary)["per_step"]
    worker = next(p for p in doc["processes"] if p["key"] == "WorkerDict:0")
    assert worker["busy_ns"] == [47 * MS, 47 * MS] and worker["idle_ns"] == [53 * MS, 53 * MS]
    assert doc["clock"]["aligned_by"] == "wall" and doc["split"] == 1
    assert [link["phase"] for link in doc["steps"][1]["critical_path"]] == [
        "generate_sequences", "compute_log_prob", "update_actor",
    ]  # fmt: skip


def test_the_summary_without_the_per_step_part() -> None:
    from mstx_marks.analysis.model.steps import StepOptions

    summary = summarize(job_traces(), steps=StepOptions(per_step=False))
    assert summary.per_step is None
    assert "per step:" not in format_table(summary)
    assert format_json(summary)["per_step"] is None


@pytest.mark.parametrize("held", [True, False], ids=["held", "one-pass"])
def test_spills_give_the_same_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: bool
) -> None:
    """Read from spills (their headers give host and anchor), held or in one pass, the model is
    the one made from memory."""
    for trace in job_traces():
        _write_spill(tmp_path, trace)
    if not held:
        monkeypatch.setattr(stream, "MAX_HELD_EVENTS", 0)
    summary = summarize_path(tmp_path, jobs=1, progress=False)
    assert summary.errors == []
    assert summary.per_step is not None
    assert steps_json(summary.per_step) == steps_json(_model())


def test_the_model_does_not_depend_on_the_order_of_the_files() -> None:
    traces = job_traces()
    want = steps_json(_model())
    for seed in range(3):
        random.Random(seed).shuffle(traces)
        model = summarize(traces).per_step
        assert model is not None and steps_json(model) == want


def test_spmd_ranks_are_attributed_to_their_own_steps() -> None:
    """Ranks that each time their own steps: matched by key, each with its own length."""
    a, b = ProcessSpans(), ProcessSpans()
    a.add(0, 60, "fwd")
    a.set_steps([Step(0, 100, "1", 100)])
    b.add(1000, 1070, "fwd")  # its step 1 starts much later (another pace): still step 1
    b.set_steps([Step(1000, 1080, "1", 80)])
    model = analyse([(Member("", 0), a.finish()), (Member("", 1), b.finish())])
    assert model is not None
    row = model.row(Member("", 1))
    assert row.own and (row.length_ns[0], row.busy_ns[0], row.idle_ns(0)) == (80, 70, 10)


def test_the_outer_loop_defines_the_steps() -> None:
    """One trainer and one worker whose profiler counts steps of its own inside the trainer's:
    the trainer's (longer) steps are the job's; the worker is attributed to them by time."""
    trainer, worker = ProcessSpans(), ProcessSpans()
    trainer.add(0, 150, "gen")
    trainer.set_steps([Step(0, 100, "1", 100), Step(100, 200, "2", 100)])
    worker.add(10, 190, "update_actor")
    worker.set_steps([Step(10 * i, 10 * i + 10, str(i), 10) for i in range(1, 19)])
    model = analyse([(Member("WorkerDict", 0), worker.finish()), (TRAINER, trainer.finish())])
    assert model is not None and model.reference == TRAINER
    row = model.row(Member("WorkerDict", 0))
    assert not row.own and list(row.busy_ns) == [90, 90]


def test_a_spill_says_its_host_and_clock_anchor(tmp_path: Path) -> None:
    import socket

    from mstx_marks.backends.record import Recorder, anchor_ns
    from mstx_marks.export.spill import Spill, read_spill

    rec = Recorder()
    rec.range_end(rec.range_start("step", "default"), "default")
    trace = read_spill(Spill(tmp_path, rec, rank=0, role="trainer").write_now())
    assert (trace.host, trace.anchor_ns) == (socket.gethostname(), anchor_ns())


def test_a_joined_span_cut_by_an_edge_says_how_far_it_may_be_off() -> None:
    s = SpanSet()
    for i in range(100):
        s.add(10 * i, 10 * i + 4)  # 4 of every 10
    s.compact(1)
    (cover, doubt), truth = s.clip([(0, 500)])[:2], 200
    assert s.cover_ns == 400  # the cover is kept exactly
    assert doubt[0] > 0 and abs(cover[0] - truth) <= doubt[0]


def test_a_process_of_many_ranges_is_kept_bounded_and_its_figures_said_to_be_estimates() -> None:
    """A rollout engine of 40,000 decode steps, over 3 trainer steps whose edges fall in the
    middle of its work: its spans are joined to bound memory, and what a step's edge cuts is
    estimated, within what the note and ``uncertain_ns`` say."""
    trainer, engine = ProcessSpans(), ProcessSpans()
    trainer.set_steps([Step(i * 100_000, (i + 1) * 100_000, str(i + 1), 0) for i in range(3)])
    trainer.add(0, 300_000, "gen")
    for k in range(40_000):
        engine.add(k * 7 + 1000, k * 7 + 1004 + k % 2, "vllm_one_step")
    engine.finish()
    assert engine.span_count <= 2 * 2048
    model = analyse([(TRAINER, trainer.finish()), (ENGINE, engine)])
    assert model is not None
    row = model.row(ENGINE)
    truth = [
        sum(min(k * 7 + 1004 + k % 2, b) - max(k * 7 + 1000, a) for k in range(40_000)
            if k * 7 + 1000 < b and k * 7 + 1004 + k % 2 > a)
        for a, b in ((0, 100_000), (100_000, 200_000), (200_000, 300_000))
    ]  # fmt: skip
    for i in range(3):
        assert abs(row.busy_ns[i] - truth[i]) <= row.uncertain_ns[i]
    assert sum(row.busy_ns) == sum(truth)  # the edges split the joined spans, nothing lost
    assert any("estimated" in note and ENGINE.label in note for note in model.notes)


# --- invariants ------------------------------------------------------------------------------

_ranges = st.lists(
    st.tuples(st.integers(0, 1000), st.integers(0, 200), st.sampled_from(["a", "b", "c"])),
    max_size=40,
)
_edges = st.lists(st.integers(0, 1200), min_size=2, max_size=8, unique=True).map(sorted)


def _brute(ranges: list[tuple[int, int]], a: int, b: int) -> int:
    covered = set()
    for s, e in ranges:
        covered.update(range(max(s, a), min(e, b)))
    return len(covered)


@settings(max_examples=150, deadline=None)
@given(_ranges, _edges)
def test_a_set_clipped_to_windows_is_the_union_inside_each(
    ranges: list[tuple[int, int, str]], edges: list[int]
) -> None:
    spans = [(s, s + d) for s, d, _ in ranges]
    s = SpanSet()
    for a, b in spans:
        s.add(a, b)
    windows = list(zip(edges, edges[1:]))
    clipped = s.clip(windows)
    assert list(clipped.cover) == [_brute(spans, a, b) for a, b in windows]
    assert not any(clipped.uncertain)
    assert sum(clipped.cover) + clipped.outside == s.cover_ns  # the parts add up to the whole


def _spans(ranges: list[tuple[int, int, str]], order: int = 0) -> ProcessSpans:
    p = ProcessSpans()
    shuffled = list(ranges)
    random.Random(order).shuffle(shuffled)
    for s, d, name in shuffled:
        p.add(s, s + d, name)
    return p


@settings(max_examples=100, deadline=None)
@given(_ranges, _ranges, _edges)
def test_busy_and_idle_make_the_step_and_the_order_does_not_matter(
    trainer: list[tuple[int, int, str]], worker: list[tuple[int, int, str]], edges: list[int]
) -> None:
    steps = [Step(a, b, str(i), b - a) for i, (a, b) in enumerate(zip(edges, edges[1:]), 1)]

    def model(order: int) -> StepAnalysis:
        t = _spans(trainer, order)
        t.set_steps(steps)
        procs = [
            (Member("trainer", 0), t.finish()),
            (Member("worker", 0), _spans(worker, order).finish()),
        ]
        random.Random(order).shuffle(procs)
        found = analyse(procs)
        assert found is not None
        return found

    first = model(0)
    for p in first.processes:
        for i in range(len(first.steps)):
            assert p.busy_ns[i] + p.idle_ns(i) == p.length_ns[i] == first.steps[i].length_ns
            assert p.busy_ns[i] >= max((v[i] for v in p.phases.values()), default=0)
        spans = [(s, s + d) for s, d, _ in (trainer if p.member.role == "trainer" else worker)]
        assert sum(p.busy_ns) + p.outside_ns == _brute(spans, 0, 2000)
    assert steps_json(model(1)) == steps_json(first)


@settings(max_examples=100, deadline=None)
@given(_ranges, st.integers(0, 40))
def test_two_parts_merged_are_the_whole(ranges: list[tuple[int, int, str]], cut: int) -> None:
    whole = _spans(ranges).finish()
    left, right = _spans(ranges[:cut]), _spans(ranges[cut:])
    merged = left.merge(right).finish()
    assert merged.busy.spans() == whole.busy.spans()
    assert {n: s.spans() for n, s in merged.phases.items() if len(s)} == {
        n: s.spans() for n, s in whole.phases.items() if len(s)
    }


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 500)), min_size=1, max_size=300),
       st.integers(1, 20), _edges)  # fmt: skip
def test_joining_spans_keeps_the_cover_and_bounds_each_window(
    ranges: list[tuple[int, int]], limit: int, edges: list[int]
) -> None:
    spans = [(s, s + d) for s, d in ranges]
    s = SpanSet()
    for a, b in spans:
        s.add(a, b)
    total = s.cover_ns
    s.compact(limit)
    assert s.cover_ns == total and len(s) <= max(limit, 1)
    windows = [(a * 800, b * 800) for a, b in zip(edges, edges[1:])]
    clipped = s.clip(windows)
    for (a, b), cover, doubt in zip(windows, clipped.cover, clipped.uncertain):
        assert abs(cover - covered(spans, a, b)) <= doubt


# --- bounded memory that stays exact at the job's step edges -----------------------------------

_gaps = st.lists(st.tuples(st.integers(0, 50), st.integers(1, 50)), min_size=2, max_size=300)


def _laid(pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges one after another: each ``gap`` after the last, ``length`` long (gaps of 0 touch)."""
    out, t = [], 0
    for gap, length in pieces:
        out.append((t + gap, t + gap + length))
        t += gap + length
    return out


@settings(max_examples=150, deadline=None)
@given(_gaps, st.integers(1, 40), st.lists(st.integers(0, 20_000), max_size=6))
def test_joining_takes_exactly_the_joins_needed_and_never_crosses_a_fence(
    pieces: list[tuple[int, int]], limit: int, cuts: list[int]
) -> None:
    """However alike the gaps (periodic ranges), a set and a process's model steps are joined
    down to ``limit`` exactly, never across a fence: each fenced window's cover and counts stay
    exact."""
    ranges = _laid(pieces)
    fences = sorted({0, *cuts, ranges[-1][1]})
    s, b = SpanSet(), Batches()
    for lo, hi in ranges:
        s.add(lo, hi)
        b.add(lo, hi, "decode_batch", {"reqs": 1, "tokens": 2})
    spans, runs = len(s.settle()), len(ranges)
    s.compact(limit, fences)
    b.compact(limit, fences)
    # the joins that put no fence inside are there for the taking: as many as needed are made
    free = sum(
        1 for (a, _), (_, e) in zip(ranges, ranges[1:]) if not any(a < f < e for f in fences)
    )
    assert len(b) == max(min(limit, runs), runs - free)
    assert min(limit, spans) <= len(s) <= max(limit, spans - free)
    windows = list(zip(fences, fences[1:]))
    clipped, counted = s.clip(windows), b.clip(windows)
    across = sum(1 for lo, hi in ranges if any(lo < f < hi for f in fences))  # (cut, alone)
    assert not any(clipped.uncertain) and counted.cut == across
    for (lo, hi), cover, n, tokens in zip(windows, clipped.cover, counted.decode, counted.tokens):
        assert cover == covered(ranges, lo, hi)
        inside = sum(1 for a, e in ranges if lo <= (a + e) // 2 < hi)
        assert (n, tokens) == (inside, 2 * inside)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 99), min_size=1, max_size=4, unique=True), st.integers(3, 9))
def test_a_process_read_again_with_the_jobs_step_edges_is_exact(
    cuts: list[int], every: int
) -> None:
    """An engine whose evenly spaced decode steps run through the trainer's steps: bounding its
    memory joins them across the edges (its figures then estimates); the second reading
    ``fences_needed`` asks for, with those edges as fences, is exact."""
    edges = [0, *sorted(c * 100 * every for c in cuts), 100 * 100 * every]
    trainer = ProcessSpans()
    trainer.set_steps(
        [Step(a, b, str(i), b - a) for i, (a, b) in enumerate(zip(edges, edges[1:]), 1)]
    )
    trainer.add(0, edges[-1], "gen")
    decodes = [(k * every, k * every + 2) for k in range(10_000)]

    def engine(fences: list[int] | None = None) -> ProcessSpans:
        made = ProcessSpans(fences=fences or ())
        for lo, hi in decodes:
            made.add(lo, hi, "decode_batch")
        return made.finish()

    first = engine()
    procs = [(TRAINER, trainer.finish()), (ENGINE, first)]
    needed = fences_needed(procs)
    # (to fit, most of its decode steps are joined into one span: an edge there needs them)
    assert needed or not any(e < 0.8 * edges[-1] for e in edges[1:-1])
    if needed:
        ((which, fences),) = needed
        assert which is first and fences == edges
        procs[1] = (ENGINE, engine(fences))
    model = analyse(procs)
    assert model is not None
    row = model.row(ENGINE)
    truth = [covered(decodes, a, b) for a, b in zip(edges, edges[1:])]
    assert list(row.busy_ns) == truth and not any(row.uncertain_ns)
    assert row.batches is not None
    assert list(row.batches.decode) == [(b - a) // every for a, b in zip(edges, edges[1:])]
    assert fences_needed(procs) == []
