"""The HTML report's pipeline view (analysis/render/report/pipeline.js): the per-step model of
analysis/model/rl_steps.py drawn per step x process in headless Chromium. What it draws is the
model's, read back from the SVG Chromium built: one lane per role x rank, each process at true
times (its step's bins, analysis/model/step_bins.py: each bin's busy time what the process's ranges
cover there, the bins adding up to the model's busy figure), the critical path at its times,
the waited-for ticks on the work they waited for, the long tail the model's what-if names; for
a synchronous job, an async one whose generation overlaps training, and random ones
(hypothesis). ``REPORT_SCREENSHOTS=DIR`` also saves the async job's view as DIR/
pipeline-async.png (the documentation's picture)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from support.chromium import SvgShapes, rendered, run_chromium

from mstx_marks.analysis.model.rl_steps import StepAnalysis
from mstx_marks.analysis.render.report_html import pipeline_data, render_html, report_data
from mstx_marks.analysis.render.rl_steps_text import steps_json
from mstx_marks.analysis.summary import summarize
from mstx_marks.base.records import Member, RangeRecord, RankTrace

MS = 10**6
T0 = 1_750_000_000_000_000_000
ANCHOR = T0 - 10**12
#: A hundredth of a pixel: times reach the page as JSON numbers, which JavaScript reads as
#: doubles (an epoch in ns to about 256 ns), far below a pixel at any scale the view draws.
PX = 0.01


def job(steps: int = 3, late_ms: int = 0) -> list[RankTrace]:
    """A verl-like job on one host: the trainer's loop (generate_sequences, compute_log_prob,
    update_actor in each 190 ms step), four rollout engines generating (rank 2 the long tail,
    20 ms more in step 2), two FSDP workers; WorkerDict rank 1's wall clock ``late_ms`` ahead
    when it started (its anchor says so)."""
    recs: dict[Member, list[RangeRecord]] = {}

    def late(m: Member) -> int:
        return late_ms * MS if m == Member("WorkerDict", 1) else 0

    def add(m: Member, name: str, s: int, e: int) -> None:
        t = T0 + late(m)
        recs.setdefault(m, []).append(RangeRecord(name, "default", t + s * MS, t + e * MS, 1, 100))

    trainer = Member("TaskRunner", 0)
    for k in range(steps):
        b, slow = k * 200, 20 if k == 1 else 0
        add(trainer, "step", b, b + 190)
        add(trainer, "generate_sequences", b + 2, b + 80 + slow)
        add(trainer, "compute_log_prob", b + 82 + slow, b + 110)
        add(trainer, "update_actor", b + 112, b + 185)
        for r in range(4):
            add(Member("vLLMEngine", r), "generate", b + 4,
                b + 64 + 3 * r + (18 + slow if r == 2 else 0))  # fmt: skip
        for r in range(2):
            add(Member("WorkerDict", r), "compute_log_prob", b + 84 + slow, b + 108)
            add(Member("WorkerDict", r), "update_actor", b + 114, b + 170 + 12 * r)
    return [
        RankTrace(m.rank, rs, role=m.role, host="node-a", anchor_ns=ANCHOR + late(m))
        for m, rs in recs.items()
    ]


def test_the_page_takes_the_steps_and_the_clocks_from_the_model() -> None:
    traces = job(late_ms=5)
    summary = summarize(traces)
    model = summary.per_step
    assert model is not None and model.clock.shifts_ns == {Member("WorkerDict", 1): -5 * MS}
    data = report_data(traces, summary)
    # the model in its one JSON form (summary --json's), its times on the page's axis (from
    # the first event), its lanes by role, then rank
    origin = data["origin_ns"]
    assert data["pipeline"] == pipeline_data(model, origin, summary.step_spans)
    shown, doc = data["pipeline"]["model"], steps_json(model)
    assert shown["processes"] == doc["processes"] and shown["clock"] == doc["clock"]
    for step, ours in zip(model.steps, shown["steps"]):
        assert (ours["start_ns"] + origin, ours["end_ns"] + origin) == (step.start_ns, step.end_ns)
        path = [(x["start_ns"], x["waited"]["end_ns"]) for x in ours["critical_path"]]
        assert path == [(x.start_ns - origin, x.waited_end_ns - origin) for x in step.path]
    lanes = [model.processes[i].member for i in data["pipeline"]["lanes"]]
    assert lanes == [Member("TaskRunner", 0), Member("WorkerDict", 0), Member("WorkerDict", 1),
                     *(Member("vLLMEngine", r) for r in range(4))]  # fmt: skip
    # the timeline's steps are the model's, on the page's axis
    assert data["steps"] == [[round((s.start_ns - origin) / 1000, 3), s.key] for s in model.steps]
    assert [key for _, key in data["steps"]] == ["1", "2", "3"]
    # and its bars are on the model's clock: the late worker's update_actor starts with the
    # other's, as it did (its recorded times are 5 ms late)
    names = data["names"]

    def starts(member: Member) -> list[float]:
        (g,) = [g for g in data["groups"] if Member(g["role"], g["rank"]) == member]
        lanes = range(g["top"], g["top"] + g["lanes"])
        return [b[1] for b in data["bars"] if b[0] in lanes and names[b[3]] == "update_actor"]

    assert starts(Member("WorkerDict", 1)) == starts(Member("WorkerDict", 0))
    assert len(starts(Member("WorkerDict", 0))) == 3


def test_without_steps_there_is_no_model_and_no_step_line() -> None:
    trace = RankTrace(0, [RangeRecord("gen", "default", T0, T0 + MS, 1, 1)])
    summary = summarize([trace])
    assert summary.per_step is None
    data = report_data([trace], summary)
    assert data["pipeline"] is None and data["steps"] == []


def _float(shape: dict[str, str], key: str) -> float:
    return float(shape[key])


def _at(shapes: list[dict[str, str]], lane: int, step: int) -> list[dict[str, str]]:
    return [
        s for s in shapes if s.get("data-lane") == str(lane) and s.get("data-step") == str(step)
    ]


#: Where a process's ranges lay (aligned axis, ns): the time they cover in ``[a, b)``.
Truth = Callable[[Member, int, int], int]


def covered_by(traces: list[RankTrace], model: StepAnalysis) -> Truth:
    """By hand, from the records: what each process's phase ranges (not its steps) cover in a
    window, on the model's axis (each moved by its clock shift)."""
    spans: dict[Member, list[tuple[int, int]]] = {}
    for t in traces:
        d = model.clock.shifts_ns.get(t.member, 0)
        spans[t.member] = sorted(
            (r.start_ns + d, r.end_ns + d)
            for r in t.records
            if isinstance(r, RangeRecord) and r.name != "step"
        )

    def cover(member: Member, a: int, b: int) -> int:
        total, hi = 0, a
        for s, e in spans.get(member, []):
            s, e = max(s, hi), min(e, b)
            if e > s:
                total += e - s
                hi = e
        return total

    return cover


def check_view(
    shapes: SvgShapes,
    model: StepAnalysis,
    lanes: list[int],
    origin: int = 0,
    truth: Truth | None = None,
) -> None:
    """The view ``shapes`` read from Chromium against the model's own figures (not its JSON):
    every shape's place and width, none drawn where the model has nothing; each lane's bins
    add up to the model's busy time, and (``truth``: where its ranges lay, by hand) each bin
    holds what they cover there."""
    scale = float(shapes.svg["data-scale"])
    assert scale > 0
    # one lane per role x rank, each once, labelled with it
    members = [model.processes[i].member for i in lanes]
    assert sorted(members) == sorted(p.member for p in model.processes)
    assert len(set(members)) == len(members)
    labels = sorted((t for t in shapes.texts if "data-lane" in t), key=_lane)
    shown = [t["text"].removeprefix("\u2691 ").split(" (")[0] for t in labels]
    assert shown == [m.label for m in members]
    assert len(shapes.steps) == len(model.steps)  # (at most 8: all of them here)
    tails: set[int] = set()
    right = -math.inf
    for band in shapes.steps:
        j = int(band["data-step"])
        step = model.steps[j]
        x = _float(band, "data-x")
        assert math.isclose(_float(band, "data-width"), step.length_ns * scale, abs_tol=PX)
        assert x >= right - PX  # bands in step order, side by side
        right = x + step.length_ns * scale

        def at(ns: int, x: float = x, start: int = step.start_ns) -> float:
            return x + (ns + origin - start) * scale  # a time on the page's axis, in this band

        for k, i in enumerate(lanes):
            p = model.processes[i]
            here = _at(shapes.rects, k, j)
            kinds = sorted({r["class"] for r in here} - {"waited", "longtail"})
            if not p.present(j):
                assert kinds == ["absent"]
                continue
            busy, idle = p.busy_ns[j], p.idle_ns(j)
            (window,) = [r for r in here if r["class"] == "window"]
            assert (int(window["data-ns"]), int(window["data-idle-ns"])) == (busy, idle)
            assert f"busy {busy / 1e6:.3f} ms" in window["title"]
            assert f"idle {idle / 1e6:.3f} ms" in window["title"]
            bins = [r for r in here if r["class"] == "bin"]
            assert kinds == ["bin", "window"] if bins else ["window"]
            if truth is None and not bins:
                continue  # (spans not known: where it was busy is not drawn)
            # at true times, bounded: the bins add up exactly to the step's figure
            assert sum(int(r["data-ns"]) for r in bins) == busy
            for r in bins:
                a, b, cover = int(r["data-start-ns"]), int(r["data-end-ns"]), int(r["data-ns"])
                assert 0 < cover <= b - a
                assert math.isclose(_float(r, "x"), at(a), abs_tol=PX)
                assert math.isclose(_float(r, "width"), (b - a) * scale, abs_tol=PX)
                if truth is not None:
                    assert cover == truth(p.member, a + origin, b + origin), (p.member, j, r)
                    if r["data-phase"]:
                        assert p.phases[r["data-phase"]][j] > 0
        # the critical path, at its times; a tick where it waited for another process
        crit = sorted((r for r in shapes.of("crit") if r["data-step"] == str(j)), key=_x)
        assert len(crit) == len(step.path)
        for r, link in zip(crit, sorted(step.path, key=lambda x: x.start_ns)):
            assert int(r["data-ns"]) == link.time_ns
            assert math.isclose(_float(r, "x"), at(link.start_ns - origin), abs_tol=PX)
            width = (link.end_ns - link.start_ns) * scale
            assert math.isclose(_float(r, "width"), width, abs_tol=PX)
        waited = sorted(
            (members.index(link.waited), at(link.waited_end_ns - origin))
            for link in step.path
            if link.waited is not None and link.waited in members
        )
        ticks = [r for r in shapes.of("waited") if r["data-step"] == str(j)]
        drawn = sorted((int(r["data-lane"]), _x(r) + _float(r, "width") / 2) for r in ticks)
        assert [k for k, _ in drawn] == [k for k, _ in waited]
        assert all(math.isclose(a, b, abs_tol=PX) for (_, a), (_, b) in zip(drawn, waited))
        if truth is not None:  # each on the work it waited for: a busy bin ends there
            for r in ticks:
                t = int(r["data-at-ns"])
                lane_bins = _at(shapes.of("bin"), int(r["data-lane"]), j)
                assert any(int(b["data-start-ns"]) < t <= int(b["data-end-ns"]) for b in lane_bins)
        # the long tail: the lane of the rank the what-if names, in this step
        flags = [int(r["data-lane"]) for r in shapes.of("longtail") if r["data-step"] == str(j)]
        w = step.what_if
        expected = [] if w is None else [members.index(Member(w.role, w.slowest_rank))]
        assert flags == expected
        tails.update(flags)
    for k, t in enumerate(labels):
        assert (t["class"] == "lane flag") == (k in tails), t


def _x(shape: dict[str, str]) -> float:
    return _float(shape, "x")


def _lane(shape: dict[str, str]) -> int:
    return int(shape["data-lane"])


def test_the_pipeline_view_draws_the_jobs_model_in_chromium(tmp_path: Path) -> None:
    traces = job(late_ms=5)  # (WorkerDict rank 1 placed by its clock: its bins too)
    summary = summarize(traces)
    model = summary.per_step
    assert model is not None
    page = tmp_path / "report.html"
    page.write_text(render_html(traces, summary))
    dom = rendered(page, tmp_path)
    shapes = SvgShapes(dom)
    lanes = pipeline_data(model)["lanes"]  # type: ignore[index]
    origin = report_data(traces, summary)["origin_ns"]
    check_view(shapes, model, lanes, origin, covered_by(traces, model))
    # what it says of this job: the rollout engine rank 2 is the long tail of every step;
    # the trainer waited for it in generate_sequences, for the slower worker in update_actor
    labels = [t["text"] for t in shapes.texts if "data-lane" in t]
    assert labels == ["TaskRunner rank 0 (reference)", "WorkerDict rank 0", "WorkerDict rank 1",
                      "vLLMEngine rank 0", "vLLMEngine rank 1", "\u2691 vLLMEngine rank 2",
                      "vLLMEngine rank 3"]  # fmt: skip
    for step in model.steps:
        assert [link.phase for link in step.path] == [
            "generate_sequences", "compute_log_prob", "update_actor"]  # fmt: skip
        assert step.path[0].waited == Member("vLLMEngine", 2)
        assert step.path[2].waited == Member("WorkerDict", 1)
    assert len(shapes.of("window")) == 3 * 7  # every process in every step
    # at true times: the workers idle through the rollout, so their first bins are empty
    worker = lanes.index(next(i for i, p in enumerate(model.processes)
                              if p.member == Member("WorkerDict", 0)))  # fmt: skip
    first = min(int(r["data-bin"]) for r in _at(shapes.of("bin"), worker, 0))
    assert first >= 48 * 84 // 190  # its compute_log_prob starts 84 ms into the 190 ms step
    assert len(shapes.of("longtail")) == 3
    assert 'data-pipeline-lanes="7"' in dom and 'data-steps="3"' in dom  # the timeline's too


def test_a_run_without_steps_says_so_in_chromium(tmp_path: Path) -> None:
    trace = RankTrace(0, [RangeRecord("gen", "default", T0, T0 + MS, 1, 1)])
    page = tmp_path / "report.html"
    page.write_text(render_html([trace], summarize([trace])))
    dom = rendered(page, tmp_path)
    assert "No per-step analysis: no process has steps" in dom
    assert not SvgShapes(dom).rects


def async_job(steps: int = 4) -> list[RankTrace]:
    """A one-step-off async job on one host: the trainer's 200 ms steps (a short wait for the
    rollout made during the step before, compute_log_prob, update_actor), two FSDP workers
    training, and four rollout engines already generating the next step's batch while they
    train (engine 3 the slowest)."""
    recs: dict[Member, list[RangeRecord]] = {}

    def add(m: Member, name: str, s: float, e: float) -> None:
        rec = RangeRecord(name, "default", T0 + int(s * MS), T0 + int(e * MS), 1, 100)
        recs.setdefault(m, []).append(rec)

    trainer = Member("TaskRunner", 0)
    for k in range(steps):
        b = k * 200
        add(trainer, "step", b, b + 195)
        add(trainer, "generate_sequences", b + 1, b + 12 + (k == 0) * 60)
        add(trainer, "compute_log_prob", b + 14 + (k == 0) * 60, b + 60 + (k == 0) * 30)
        add(trainer, "update_actor", b + 62 + (k == 0) * 30, b + 190)
        for r in range(2):
            add(Member("WorkerDict", r), "compute_log_prob", b + 16 + (k == 0) * 60, b + 58)
            add(Member("WorkerDict", r), "update_actor", b + 64 + (k == 0) * 30, b + 180 + 6 * r)
        for r in range(4):  # the next step's rollout, during this step's training
            add(Member("vLLMEngine", r), "generate", b + 20, b + 120 + 12 * r + (r == 3) * 50)
    return [RankTrace(m.rank, rs, role=m.role, host="node-a", anchor_ns=ANCHOR)
            for m, rs in recs.items()]  # fmt: skip


def test_an_async_jobs_generation_overlapping_training_is_drawn_where_it_ran(
    tmp_path: Path,
) -> None:
    traces = async_job()
    summary = summarize(traces)
    model = summary.per_step
    assert model is not None and model.reference == Member("TaskRunner", 0)
    page = tmp_path / "report.html"
    page.write_text(render_html(traces, summary, title="async GRPO: one step off"))
    dom = rendered(page, tmp_path)
    shapes = SvgShapes(dom)
    lanes = pipeline_data(model)["lanes"]  # type: ignore[index]
    origin = report_data(traces, summary)["origin_ns"]
    check_view(shapes, model, lanes, origin, covered_by(traces, model))
    # in every step, an engine generating and a worker training at the same time, both drawn
    members = [model.processes[i].member for i in lanes]
    for j in range(len(model.steps)):

        def busy(role: str, j: int = j) -> list[tuple[int, int]]:
            return [
                (int(r["data-start-ns"]), int(r["data-end-ns"]))
                for r in shapes.of("bin")
                if r["data-step"] == str(j) and members[int(r["data-lane"])].role == role
            ]

        engines, workers = busy("vLLMEngine"), busy("WorkerDict")
        assert any(a < d and c < b for a, b in engines for c, d in workers), j
    shots = os.environ.get("REPORT_SCREENSHOTS")
    if shots:  # the documentation's picture: the view alone (the rest of the page set aside)
        aside = "#tl,#bar,#legend,#tip,h1,h1+p,table,h2:not(#pipehead),p.note:not(#pipenote)"
        style = f"<style>{aside},#imbalance{{position:absolute;left:-99999px}}</style>"
        alone = tmp_path / "pipeline.html"
        alone.write_text(page.read_text().replace("</head>", style + "</head>"))
        png = Path(shots) / "pipeline-async.png"
        run = run_chromium(tmp_path, f"--screenshot={png}", "--window-size=1400,330",
                           alone.as_uri())  # fmt: skip
        assert run.returncode == 0 and png.stat().st_size > 0, run.stderr[-2000:]


ROLES = ["TaskRunner", "vLLMEngine", "WorkerDict", ""]
PHASES = ["gen", "update_actor", "ref", "<b>x</b> & 'q'"]


@st.composite
def jobs(draw: st.DrawFn) -> list[RankTrace]:
    """Any job of a few processes: the first role's rank 0 with steps (the reference), its
    other ranks with steps of their own or none, any ranges of any phases anywhere (across
    step edges, overlapping, outside every step), in microseconds."""
    roles = draw(st.lists(st.sampled_from(ROLES), min_size=1, max_size=3, unique=True))
    members = [Member(r, k) for r in roles for k in range(draw(st.integers(1, 3)))]
    us = 1000
    edges = sorted(draw(st.lists(st.integers(0, 400), min_size=2, max_size=9, unique=True)))
    traces = []
    for m in members:
        recs = []
        own = m == members[0] or (m.role == roles[0] and draw(st.booleans()))
        if own:
            cut = edges if m == members[0] else draw(st.sampled_from([edges, edges[:-1]]))
            for a, b in zip(cut, cut[1:]):
                if m == members[0] or draw(st.booleans()):  # (its own steps: some of them)
                    skew = 0 if m == members[0] else draw(st.integers(0, 5))
                    recs.append(RangeRecord("step", "d", T0 + (a + skew) * us,
                                            T0 + (b + skew) * us, 1, 10))  # fmt: skip
        for _ in range(draw(st.integers(0, 8))):
            s = draw(st.integers(-20, 420)) * us
            recs.append(RangeRecord(draw(st.sampled_from(PHASES)), "d", T0 + s,
                                    T0 + s + draw(st.integers(0, 150)) * us, 1, 10))  # fmt: skip
        if recs:
            traces.append(RankTrace(m.rank, recs, role=m.role))
    return traces


# (no shrinking: each example is a Chromium run of about 2 s)
@settings(
    max_examples=6,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(traces=jobs())
def test_what_the_view_draws_adds_up_to_the_models_figures_in_any_job(
    tmp_path: Path, traces: list[RankTrace]
) -> None:
    summary = summarize(traces)
    model = summary.per_step
    assert model is not None  # (the reference has a step)
    page = tmp_path / "report.html"
    page.write_text(render_html(traces, summary))
    dom = rendered(page, tmp_path)
    assert "<b>x</b>" not in dom  # a phase's name is text, never markup
    lanes = pipeline_data(model)["lanes"]  # type: ignore[index]
    origin = report_data(traces, summary)["origin_ns"]
    check_view(SvgShapes(dom), model, lanes, origin, covered_by(traces, model))


def test_a_model_without_its_spans_draws_its_figures_not_where(tmp_path: Path) -> None:
    """A summary whose spans are not known (a model of its own): each lane's window with its
    figures, no bin, and the view says so on hover."""
    traces = job(steps=2)
    summary = summarize(traces)
    summary.step_spans = []
    page = tmp_path / "report.html"
    page.write_text(render_html(traces, summary))
    shapes = SvgShapes(rendered(page, tmp_path))
    assert summary.per_step is not None and not shapes.of("bin")
    check_view(shapes, summary.per_step, pipeline_data(summary.per_step)["lanes"])  # type: ignore[index]
    assert all("is not known" in r["title"] for r in shapes.of("window"))
