from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.recorded import PID, T0, TID, rng, synthetic_rank, two_overlapping_tasks

from mstx_marks.analysis.model.steps import fold_name
from mstx_marks.analysis.render.report_html import report_data
from mstx_marks.analysis.render.timeline import MIN_BAR_PX, assign_lanes, render_svg, write_svg
from mstx_marks.analysis.summary import summarize
from mstx_marks.base.records import RangeRecord, RankTrace

SVG = "{http://www.w3.org/2000/svg}"


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def test_one_bar_per_range_in_its_rank_row_and_in_order() -> None:
    traces = [synthetic_rank(1, steps=2, tokens=3), synthetic_rank(0, steps=2, tokens=3, slow=9)]
    root = _parse(render_svg(traces))
    rows = root.findall(f"{SVG}g[@class='rank']")
    assert [r.get("data-rank") for r in rows] == ["0", "1"]
    for row, trace in zip(rows, sorted(traces, key=lambda t: t.rank)):
        bars = row.findall(f"{SVG}rect[@class='range']")
        assert len(bars) == len(trace.ranges) == 2 * (1 + 1 + 3 + 1)
        assert {b.get("data-rank") for b in bars} == {row.get("data-rank")}
        starts = [int(b.get("data-start-ns", "")) for b in bars]
        assert starts == sorted(r.start_ns for r in trace.ranges)
        xs = [float(b.get("x", "")) for b in bars]
        assert xs == sorted(xs)
        assert len(row.findall(f"{SVG}line[@class='step']")) == 2
        # nested ranges sit one lane lower than what contains them
        ys = {b.get("data-name"): float(b.get("y", "")) for b in bars}
        assert ys["step"] < ys["gen"] < ys["vllm_one_step"]
        assert ys["gen"] == ys["update_actor"]
    row0_bottom = max(float(b.get("y", "")) for b in rows[0].iter(f"{SVG}rect"))
    row1_top = min(float(b.get("y", "")) for b in rows[1].iter(f"{SVG}rect"))
    assert row0_bottom < row1_top


def test_legend_has_one_colour_per_phase() -> None:
    root = _parse(render_svg([synthetic_rank(0)], name_of=str.upper))
    items = root.findall(f".//{SVG}g[@class='legend-item']")
    assert [i.get("data-name") for i in items] == ["STEP", "GEN", "VLLM_ONE_STEP", "UPDATE_ACTOR"]
    fills = [i.find(f"{SVG}rect").get("fill") for i in items]  # type: ignore[union-attr]
    assert len(set(fills)) == 4
    gen_bars = root.findall(f".//{SVG}rect[@data-name='GEN']")
    assert {b.get("fill") for b in gen_bars} == {fills[1]}


def test_names_are_escaped_and_empty_input_still_renders(tmp_path: Path) -> None:
    trace = synthetic_rank(0, steps=1)
    trace.records[1] = trace.records[1]._replace(name='<gen & "x">')
    root = _parse(render_svg([trace]))
    assert root.find(f".//{SVG}rect[@data-name='<gen & \"x\">']") is not None
    assert _parse(render_svg([])).tag == f"{SVG}svg"
    path = write_svg(tmp_path / "t.svg", [trace])
    assert _parse(path.read_text()).get("viewBox", "").startswith("0 0 1400 ")


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs headless chromium")
def test_renders_in_headless_chromium(tmp_path: Path) -> None:
    svg = write_svg(tmp_path / "t.svg", [synthetic_rank(0), synthetic_rank(1, slow=200)])
    png = tmp_path / "t.png"
    subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={png}",
            "--window-size=1400,300",
            svg.as_uri(),
        ],
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert png.stat().st_size > 5000  # a blank page is far smaller


def test_names_xml_cannot_hold_still_give_well_formed_svg(tmp_path: Path) -> None:
    # Control characters and lone surrogates are valid in range names but not in XML 1.0 (and a
    # surrogate cannot even be encoded): each becomes U+FFFD instead of a broken file.
    trace = synthetic_rank(0, steps=1)
    trace.records[1] = trace.records[1]._replace(name="gen\x01\x1b[0m\ud800")
    root = ET.parse(write_svg(tmp_path / "t.svg", [trace])).getroot()
    (bar,) = root.findall(f".//{SVG}rect[@data-name='gen\ufffd\ufffd[0m\ufffd']")
    assert bar.findtext(f"{SVG}title", "").startswith("gen\ufffd\ufffd[0m\ufffd (rank 0)")
    assert _parse(render_svg([trace], title="run\x00")).findtext(f"{SVG}text") == "run\ufffd"


def _bars(root: ET.Element) -> dict[str, ET.Element]:
    return {b.get("data-name", ""): b for b in root.iter(f"{SVG}rect") if b.get("class") == "range"}


def _y(bar: ET.Element) -> float:
    return float(bar.get("y", ""))


def test_gathered_tasks_that_overlap_without_nesting_get_their_own_lanes() -> None:
    # Two asyncio tasks on one thread: compute_score starts inside update_actor and ends after
    # it. Laid out by nesting depth alone, both sat in one lane and one hid the other.
    trace = two_overlapping_tasks()
    by_name = {r.name: r for r in trace.ranges}
    upd, score = by_name["update_actor"], by_name["compute_score"]
    assert upd.thread == score.thread and upd.start_ns <= score.start_ns < upd.end_ns < score.end_ns
    bars = _bars(_parse(render_svg([trace])))
    assert _y(bars["step"]) < _y(bars["update_actor"]) < _y(bars["compute_score"])
    # each bar is drawn where its time is, whatever its lane
    assert float(bars["compute_score"].get("x", "")) >= float(bars["update_actor"].get("x", ""))


def test_other_threads_get_tracks_of_their_own_and_every_lane_is_labelled() -> None:
    trace = synthetic_rank(0, steps=1)
    # a background thread whose range overlaps the whole step
    trace.records.append(RangeRecord("weight_sync", "default", T0 + 100, T0 + 1200, TID + 1, PID))
    root = _parse(render_svg([trace, synthetic_rank(1, steps=1)]))
    (row0, row1) = root.findall(f"{SVG}g[@class='rank']")
    bars = _bars(row0)
    main = [b for b in row0.iter(f"{SVG}rect") if b.get("data-thread") == str(TID)]
    assert len(main) == len(trace.ranges) - 1
    assert _y(bars["weight_sync"]) > max(_y(b) for b in main)  # below all of thread TID
    assert bars["weight_sync"].get("data-thread") == str(TID + 1)
    lane_labels = row0.findall(f"{SVG}text[@class='lane-label']")
    labels = {(t.get("data-thread"), t.get("data-lane")): t.text for t in lane_labels}
    # thread TID: step, gen/update_actor, vllm_one_step; thread TID+1: one lane
    assert labels == {
        (str(TID), "0"): f"thread {TID}",
        (str(TID), "1"): "lane 1",
        (str(TID), "2"): "lane 2",
        (str(TID + 1), "0"): f"thread {TID + 1}",
    }
    for label in lane_labels:  # each label sits on its lane's bars
        lane_bars = [
            b
            for b in row0.findall(f"{SVG}rect[@class='range']")
            if (b.get("data-thread"), b.get("data-lane"))
            == (label.get("data-thread"), label.get("data-lane"))
        ]
        label_y = float(label.get("y", ""))
        assert lane_bars and all(_y(b) < label_y < _y(b) + 16 for b in lane_bars)
    rank_labels = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "rank-label"]
    assert rank_labels == ["rank 0", "rank 1"]
    # rank 1 has one thread: its first lane is labelled by the rank, the deeper ones by number
    assert [t.text for t in row1.findall(f"{SVG}text[@class='lane-label']")] == ["lane 1", "lane 2"]


def test_a_phase_far_shorter_than_a_pixel_is_still_drawn() -> None:
    second = 10**9
    recs = [rng("step", 0, second), rng("reward", second // 2, second // 2 + 1)]
    bars = _bars(_parse(render_svg([RankTrace(0, recs)])))
    assert MIN_BAR_PX >= 1
    assert float(bars["reward"].get("width", "")) >= MIN_BAR_PX
    assert float(bars["step"].get("width", "")) > 1000  # long ones keep their true width


def test_open_ranges_are_drawn_apart_and_say_so() -> None:
    recs = [rng("step", 0, 1000), rng("update_actor", 500, 1000, open=True)]
    root = _parse(render_svg([RankTrace(0, recs)]))
    bars = _bars(root)
    assert bars["update_actor"].get("data-open") == "true" and bars["step"].get("data-open") is None
    assert "open" in bars["update_actor"].findtext(f"{SVG}title", "")
    assert "open" not in bars["step"].findtext(f"{SVG}title", "")
    (hatch,) = root.findall(f"{SVG}g[@class='rank']/{SVG}rect[@class='open-hatch']")
    geometry = ("x", "y", "width", "height")
    assert [hatch.get(k) for k in geometry] == [bars["update_actor"].get(k) for k in geometry]
    assert root.find(f".//{SVG}pattern[@id='open-hatch']") is not None
    assert root.find(f".//{SVG}g[@class='legend-open']") is not None
    closed = _parse(render_svg([RankTrace(0, recs[:1])]))
    assert (
        closed.find(f".//{SVG}pattern") is None
        and closed.find(f".//{SVG}g[@class='legend-open']") is None
    )


def test_the_svg_colours_each_phase_as_the_html_report_does() -> None:
    """One colour per phase in both pictures of one run (the SVG once numbered its colours by
    first appearance, the report by name: ``step`` was blue in one and grey in the other)."""
    a, b = synthetic_rank(0, steps=2), synthetic_rank(1, steps=2, slow=50)
    b.records.append(rng("my_own_phase", 3000, 3100))  # a name of no palette: hashed
    b.role = "rollout"
    traces = [a, b]
    root = _parse(render_svg(traces, fold_name))  # as `summary --svg` draws it
    data = report_data(traces, summarize(traces))
    in_report = dict(zip(data["names"], data["colors"]))
    items = root.findall(f".//{SVG}g[@class='legend-item']")
    in_svg = {i.get("data-name"): i.find(f"{SVG}rect").get("fill") for i in items}  # type: ignore[union-attr]
    assert set(in_svg) >= {"step", "generate_sequences", "my_own_phase"}
    assert in_svg == {name: in_report[name] for name in in_svg}  # (the report has instants too)
    for bar in root.iter(f"{SVG}rect"):  # every bar too, not only the legend
        if bar.get("class") == "range":
            assert bar.get("fill") == in_report[bar.get("data-name", "")]


def _labelled_ranks() -> list[RankTrace]:
    """Rows whose labels once met: a long role with two threads (its label on the first
    thread's label), a long role with one thread (its label on the bars), a short role with two
    threads, and a rank with no role and one thread."""
    two = synthetic_rank(0, steps=1)
    two.records.append(RangeRecord("weight_sync", "default", T0 + 100, T0 + 1200, TID + 1, PID))
    two.role = "AgentLoopWorkerTQ_with_a_long_role_name"
    one = synthetic_rank(1, steps=1)
    one.role = "AgentLoopWorkerTQ"
    short = synthetic_rank(2, steps=1)
    short.records.append(RangeRecord("weight_sync", "default", T0 + 100, T0 + 900, TID + 1, PID))
    short.role = "TaskRunner"
    return [two, one, short, synthetic_rank(3, steps=1)]


Box = tuple[float, float, float, float]  # left, top, right, bottom


def _meet(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _estimated_boxes(row: ET.Element) -> dict[str, list[Box]]:
    """The row's rank label, lane labels and bars as boxes; a text's width estimated generously
    (0.7 em a character), its height from the font size (descenders included)."""
    out: dict[str, list[Box]] = {"rank-label": [], "lane-label": [], "range": []}
    for el in row:
        kind = el.get("class", "")
        if kind not in out:
            continue
        x, y = float(el.get("x", "")), float(el.get("y", ""))
        if kind == "range":
            width, height = float(el.get("width", "")), float(el.get("height", ""))
            out[kind].append((x, y, x + width, y + height))
            continue
        size = 12.0 if kind == "rank-label" else 9.0
        width = 0.7 * size * len(el.text or "")
        left = x - width if el.get("text-anchor") == "end" else x
        out[kind].append((left, y - size, left + width, y + 0.25 * size))
    return out


def _assert_apart(rows: list[dict[str, list[Box]]]) -> None:
    for boxes in rows:
        (rank_label,) = boxes["rank-label"]
        assert rank_label[0] >= 0
        for other in boxes["lane-label"] + boxes["range"]:
            assert not _meet(rank_label, other), (rank_label, other)
        for lane_label in boxes["lane-label"]:
            assert not any(_meet(lane_label, bar) for bar in boxes["range"]), lane_label


def test_a_rank_label_never_meets_a_thread_label_or_a_bar() -> None:
    root = _parse(render_svg(_labelled_ranks()))
    rows = root.findall(f"{SVG}g[@class='rank']")
    assert [r.get("data-role") for r in rows] == [
        None,
        "AgentLoopWorkerTQ",
        "AgentLoopWorkerTQ_with_a_long_role_name",
        "TaskRunner",
    ]
    boxes = [_estimated_boxes(row) for row in rows]
    assert all(b["lane-label"] for b in boxes[2:])  # the threads are labelled
    _assert_apart(boxes)
    # a short label with one thread keeps to its first lane: no line of its own
    (short,), bars = boxes[0]["rank-label"], boxes[0]["range"]
    assert min(bar[1] for bar in bars) < short[3]


_MEASURE_LABELS = """<!DOCTYPE html><html><body>%s<pre id="out"></pre><script>
const rows = [...document.querySelectorAll('g.rank')].map(row => {
  const boxes = {'rank-label': [], 'lane-label': [], 'range': []};
  for (const el of row.children) {
    const kind = el.getAttribute('class');
    if (!(kind in boxes)) continue;
    const b = el.getBBox();
    boxes[kind].push([b.x, b.y, b.x + b.width, b.y + b.height]);
  }
  return boxes;
});
document.getElementById('out').textContent = JSON.stringify(rows);
</script></body></html>"""


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs headless chromium")
def test_a_rank_label_never_meets_a_thread_label_or_a_bar_in_chromium(tmp_path: Path) -> None:
    """The same, with the boxes a browser draws (its fonts, not an estimate)."""
    page = tmp_path / "labels.html"
    page.write_text(_MEASURE_LABELS % render_svg(_labelled_ranks()))
    dumped = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    found = re.search(r'<pre id="out">(.*?)</pre>', dumped, re.S)
    assert found, dumped[-2000:]
    rows = json.loads(html.unescape(found.group(1)))
    assert len(rows) == 4 and all(len(r["rank-label"]) == 1 for r in rows)
    _assert_apart([{k: [tuple(b) for b in v] for k, v in r.items()} for r in rows])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30)), max_size=40))
def test_lanes_follow_their_definition(drawn: list[tuple[int, int]]) -> None:
    """Any ranges (nested, staggered, equal, empty): each in the first lane below every range
    placed before it that contains it, where every range placed so far has ended by its start,
    as the lanes' heap and the containers' staircase find it."""
    placed = assign_lanes([rng("x", s, s + d) for s, d in drawn])
    assert sorted((r.start_ns, r.end_ns) for r, _ in placed) == sorted(
        (T0 + s, T0 + s + d) for s, d in drawn
    )
    done: list[tuple[int, int, int]] = []  # (start, end, lane)
    for r, lane in placed:
        s, e = r.start_ns, r.end_ns
        below = 1 + max((k for a, b, k in done if a <= s and b >= e), default=-1)
        taken = {k for _, b, k in done if b > s}
        expected = next(k for k in range(below, len(done) + 1) if k not in taken)
        assert lane == expected
        done.append((s, e, lane))


def test_the_summarys_model_gives_the_steps_and_the_clocks() -> None:
    """Given the summary's per-step model, the picture draws its steps (the reference's, by
    key, across every rank) and places each rank where the model put it: a worker whose anchor
    says its wall clock ran 5 ms ahead is moved back; nothing is found again."""
    late = 5 * 10**6
    trainer = RankTrace(0, synthetic_rank(0, steps=2).records, role="trainer", host="h",
                        anchor_ns=10**12)  # fmt: skip
    worker = RankTrace(1, [rng("update_actor", 700 + late, 990 + late)], role="worker",
                       host="h", anchor_ns=10**12 + late)  # fmt: skip
    summary = summarize([trainer, worker])
    model = summary.per_step
    assert model is not None and model.clock.shifts_ns == {worker.member: -late}
    root = _parse(render_svg([trainer, worker], fold_name, model=model))
    for row in root.findall(f"{SVG}g[@class='rank']"):
        lines = row.findall(f"{SVG}line[@class='step']")
        assert [line.get("data-step") for line in lines] == [s.key for s in model.steps]
        xs = [float(line.get("x1", "")) for line in lines]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)
    bars = {b.get("data-name"): b for b in root.iter(f"{SVG}rect") if b.get("class") == "range"}
    # (the trainer's update_actor and the worker's, both 700 ns into the first step)
    starts = sorted(int(b.get("data-start-ns", "")) for b in root.iter(f"{SVG}rect")
                  if b.get("data-name") == "update_actor")  # fmt: skip
    assert starts[0] == starts[1] == T0 + 700
    assert "step" in bars
