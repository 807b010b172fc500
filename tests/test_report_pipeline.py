"""The HTML report's pipeline view (analysis/report/pipeline.js): the per-step model of
analysis/rl_steps.py drawn per step x process in headless Chromium. What it draws is the
model's, read back from the SVG Chromium built: one lane per role x rank, each process's busy
time and bubble at the model's figures, the critical path at its times, the long tail the
model's what-if names; for a job's model and for hand-built ones (hypothesis)."""

from __future__ import annotations

import math
from array import array
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from support.chromium import SvgShapes, rendered

from mstx_marks.analysis.report_html import pipeline_data, render_html, report_data
from mstx_marks.analysis.rl_steps import (
    ClockNote,
    PathLink,
    ProcessSteps,
    StepAnalysis,
    StepInfo,
    WhatIf,
)
from mstx_marks.analysis.rl_steps_text import steps_json
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
    assert data["pipeline"] == pipeline_data(model, origin)
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
        (g,) = [g for g in data["groups"] if (g["role"], g["rank"]) == member]
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


def check_view(shapes: SvgShapes, model: StepAnalysis, lanes: list[int]) -> None:
    """The view ``shapes`` read from Chromium against the model's own figures (not its JSON):
    every shape's place and width, none drawn where the model has nothing."""
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
        for k, i in enumerate(lanes):
            p = model.processes[i]
            here = _at(shapes.rects, k, j)
            kinds = sorted(r["class"] for r in here if r["class"] in ("busy", "bubble", "absent"))
            if not p.present(j):
                assert kinds == ["absent"]
                continue
            busy, idle = p.busy_ns[j], p.idle_ns(j)
            assert kinds == sorted(["busy"] * (busy > 0) + ["bubble"] * (idle > 0))
            for r in here:
                if r["class"] == "busy":
                    assert int(r["data-ns"]) == busy
                    assert math.isclose(_float(r, "x"), x, abs_tol=PX)
                    assert math.isclose(_float(r, "width"), busy * scale, abs_tol=PX)
                elif r["class"] == "bubble":  # the idle time, after the busy
                    assert int(r["data-ns"]) == idle
                    assert math.isclose(_float(r, "x"), x + busy * scale, abs_tol=PX)
                    assert math.isclose(_float(r, "width"), idle * scale, abs_tol=PX)
                    assert f"busy {busy / 1e6:.3f} ms" in r["title"]
                    assert f"idle {idle / 1e6:.3f} ms" in r["title"]
            parts = [r for r in here if r["class"] == "part"]
            for r in parts:
                assert int(r["data-ns"]) == p.phases[r["data-phase"]][j]
            if parts:
                assert sum(int(r["data-ns"]) for r in parts) == busy
        # the critical path, at its times; a tick where it waited for another process
        crit = sorted((r for r in shapes.of("crit") if r["data-step"] == str(j)), key=_x)
        assert len(crit) == len(step.path)
        for r, link in zip(crit, sorted(step.path, key=lambda x: x.start_ns)):
            assert int(r["data-ns"]) == link.time_ns
            at = x + (link.start_ns - step.start_ns) * scale
            assert math.isclose(_float(r, "x"), at, abs_tol=PX)
            width = (link.end_ns - link.start_ns) * scale
            assert math.isclose(_float(r, "width"), width, abs_tol=PX)
        waited = sorted(
            (members.index(link.waited), x + (link.waited_end_ns - step.start_ns) * scale)
            for link in step.path
            if link.waited is not None and link.waited in members
        )
        ticks = [r for r in shapes.of("waited") if r["data-step"] == str(j)]
        drawn = sorted((int(r["data-lane"]), _x(r) + _float(r, "width") / 2) for r in ticks)
        assert [k for k, _ in drawn] == [k for k, _ in waited]
        assert all(math.isclose(a, b, abs_tol=PX) for (_, a), (_, b) in zip(drawn, waited))
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
    traces = job()
    summary = summarize(traces)
    model = summary.per_step
    assert model is not None
    page = tmp_path / "report.html"
    page.write_text(render_html(traces, summary))
    dom = rendered(page, tmp_path)
    shapes = SvgShapes(dom)
    lanes = pipeline_data(model)["lanes"]  # type: ignore[index]
    check_view(shapes, model, lanes)
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
    assert len(shapes.of("bubble")) == 3 * 7  # every process idles in every step here
    assert len(shapes.of("longtail")) == 3
    assert 'data-pipeline-lanes="7"' in dom and 'data-steps="3"' in dom  # the timeline's too


def test_a_run_without_steps_says_so_in_chromium(tmp_path: Path) -> None:
    trace = RankTrace(0, [RangeRecord("gen", "default", T0, T0 + MS, 1, 1)])
    page = tmp_path / "report.html"
    page.write_text(render_html([trace], summarize([trace])))
    dom = rendered(page, tmp_path)
    assert "No per-step analysis: no process has steps" in dom
    assert not SvgShapes(dom).rects


ROLES = ["TaskRunner", "vLLMEngine", "WorkerDict", ""]
PHASES = ["gen", "update_actor", "ref", "<b>x</b> & 'q'"]


@st.composite
def models(draw: st.DrawFn) -> StepAnalysis:
    """A hand-built per-step model: any figures the view must place, none computed here."""
    roles = draw(st.lists(st.sampled_from(ROLES), min_size=1, max_size=3, unique=True))
    members = [Member(r, k) for r in roles for k in range(draw(st.integers(1, 3)))]
    reference = members[0]
    steps: list[StepInfo] = []
    t = T0
    for i in range(draw(st.integers(1, 4))):
        start = t + draw(st.integers(0, 10 * MS))
        steps.append(StepInfo(str(i + 1), start, start + draw(st.integers(1, 500 * MS))))
        t = steps[-1].end_ns
    n = len(steps)
    processes = []
    for m in members:
        own = m.role == reference.role
        names = draw(st.lists(st.sampled_from(PHASES), max_size=3, unique=True))
        length, busy = array("q", [-1] * n), array("q", [0] * n)
        phases = {name: array("q", [0] * n) for name in names}
        for i, step in enumerate(steps):
            if own and m != reference and draw(st.booleans()):
                continue  # its own steps lack this one
            own_length = draw(st.integers(1, 2 * step.length_ns)) if own else step.length_ns
            length[i] = step.length_ns if m == reference else own_length
            busy[i] = draw(st.integers(0, length[i]))
            if names and draw(st.booleans()):  # one at a time: their times add up to busy
                cuts = sorted(draw(st.integers(0, busy[i])) for _ in names[1:])
                for name, a, b in zip(names, [0, *cuts], [*cuts, busy[i]]):
                    phases[name][i] = b - a
            else:
                for name in names:
                    phases[name][i] = draw(st.integers(0, busy[i]))
        uncertain = array("q", [draw(st.integers(0, 1000)) for _ in range(n)])
        processes.append(ProcessSteps(m, "h", own, length, busy, phases, uncertain, {}, 0))
    for step in steps:
        marks = sorted(draw(st.lists(st.integers(step.start_ns, step.end_ns), max_size=6)))
        for a, b in zip(marks[::2], marks[1::2]):
            link = PathLink(draw(st.sampled_from(PHASES)), a, b, draw(st.integers(0, b - a)))
            if draw(st.booleans()):
                link.waited = draw(st.sampled_from(members))
                link.waited_phase = draw(st.sampled_from(PHASES))
                link.waited_end_ns = draw(st.integers(a, b))
            step.path.append(link)
        if draw(st.booleans()):
            m = draw(st.sampled_from(members))
            step.what_if = WhatIf(m.role, "gen", m.rank, 10, 5.0, 5, max(0, step.length_ns - 5))
    return StepAnalysis(reference, reference.role, steps, processes, ClockNote(["h"], []), n)


# (no shrinking: each example is a Chromium run of about 2 s)
@settings(
    max_examples=6,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(model=models())
def test_what_the_view_draws_is_the_hand_built_models_figures(
    tmp_path: Path, model: StepAnalysis
) -> None:
    trace = RankTrace(0, [RangeRecord("gen", "default", T0, T0 + MS, 1, 1)])
    summary = replace(summarize([trace]), per_step=model)
    page = tmp_path / "report.html"
    page.write_text(render_html([trace], summary))
    dom = rendered(page, tmp_path)
    assert "<b>x</b>" not in dom  # a phase's name is text, never markup
    check_view(SvgShapes(dom), model, pipeline_data(model)["lanes"])  # type: ignore[index]
