"""A timeline picture of recorded ranges: plain SVG, built with the standard library.

One row per rank, and inside a row one track per thread. In a track, a range goes below every
range that contains it, so a step, its phases and their sub-phases stack up; ranges that overlap
without nesting (asyncio tasks gathered on one thread) get lanes of their own instead of hiding
each other. Lanes are labelled (the rank, and the thread or the lane when there are several); a
rank's label gets a line of its own above its tracks when it would meet a thread's label or the
bars (several threads, a long role name).
Marks named ``X_start`` and ``X_stop`` are drawn as the range ``X``, as msprof-analyze pairs
them. Each phase name has one colour, the HTML report's (:func:`~.colors.phase_color`; see the
legend; past 200 names, those of most time, the others grey under one entry), step starts are
dashed lines (given the summary's per-step model, its steps, labelled by key, with each rank
placed where the model put it: moved by its clock shift, as in the HTML report; else each
rank's own ``step`` ranges), a bar is at
least one pixel wide however short its range, and a range still open when it was read has a dashed
outline and hatching. Hovering a bar shows its name, thread and duration. Bars are
``<rect class="range">`` with ``data-rank``, ``data-thread``, ``data-lane``, ``data-name``,
``data-start-ns`` and ``data-end-ns`` (and ``data-open`` when open), so the file can be checked
as data as well as looked at.

>>> from mstx_marks.base.records import RangeRecord
>>> from mstx_marks.export import RankTrace
>>> svg = render_svg([RankTrace(0, [RangeRecord("gen", "default", 0, 5, 1, 1)])])
>>> svg.startswith("<svg") and svg.count('class="range"')
1
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from bisect import bisect_left, bisect_right, insort
from heapq import heappop, heappush
from pathlib import Path
from typing import Callable, Sequence

from mstx_marks.analysis.model.mark_pairs import pair_marks
from mstx_marks.analysis.model.rl_steps import StepAnalysis
from mstx_marks.analysis.model.stages import range_name
from mstx_marks.analysis.model.top_phases import MAX_PHASES
from mstx_marks.analysis.render.colors import OTHER_COLOR, phase_color
from mstx_marks.base.records import RangeRecord, RankTrace
from mstx_marks.export import atomic_write_bytes

__all__ = ["MIN_BAR_PX", "OTHER_COLOR", "assign_lanes", "render_svg", "write_svg"]

_WIDTH = 1400
_LEFT = 150  # the lane labels: "rank N", then "thread T" or "lane K" right-aligned
_LABEL_X = 8  # where a rank's label starts
_LABEL_PX = 12  # its font size (text{font:12px ...} below)
_EM_PER_CHAR = 0.65  # a character's width in ems, generous (capitals; most fonts' are ~0.55)
_RIGHT = 20
_TOP = 40
_LANE = 16
_TRACK_GAP = 4  # between the threads of one rank
#: The narrowest bar, in pixels: a range far shorter than a pixel still shows.
MIN_BAR_PX = 1.0
_ROW_GAP = 12
_AXIS = 36
_LEGEND_ROW = 20
# Characters XML 1.0 cannot hold (ElementTree writes them as they are, making the file unreadable);
# range names may contain them, as may lone surrogates, which cannot even be encoded.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def assign_lanes(ranges: list[RangeRecord]) -> list[tuple[RangeRecord, int]]:
    """Each range with its lane, in start order: the first lane below every range that contains
    it (by time, as msprof-analyze nests) where it overlaps nothing already placed.

    Properly nested ranges get their nesting depth; a range that overlaps another without
    nesting in it (another task on the same thread) goes to a lane of its own.

    >>> r = lambda s, e: RangeRecord("x", "default", s, e, 1, 1)
    >>> [lane for _, lane in assign_lanes([r(0, 100), r(10, 40), r(20, 30), r(50, 90)])]
    [0, 1, 2, 1]
    >>> [lane for _, lane in assign_lanes([r(0, 100), r(10, 60), r(30, 90)])]  # 30-90 overlaps
    [0, 1, 2]
    """
    out: list[tuple[RangeRecord, int]] = []
    lanes = 0
    # The lanes in use, as a heap of (latest end, lane), and the free ones (ended by this
    # start), sorted: a lane is found by a bisection, not by scanning every lane.
    used: list[tuple[int, int]] = []
    free: list[int] = []
    # The ranges that may contain later ones, as a staircase: ends falling, lanes rising. Of
    # two with the later end and the higher lane, one says all the other would (the lowest
    # lane below everything containing a range is 1 + the highest of their lanes), so only
    # the steps are kept; they are negated so that a bisection finds them.
    neg_ends: list[int] = []
    stair: list[int] = []
    for r in sorted(ranges, key=lambda r: (r.start_ns, -r.end_ns)):
        s, e = r.start_ns, r.end_ns
        # Ranges come in start order, so one that ended before this start contains nothing more.
        while neg_ends and -neg_ends[-1] < s:
            neg_ends.pop()
            stair.pop()
        while used and used[0][0] <= s:
            insort(free, heappop(used)[1])
        k = bisect_right(neg_ends, -e)  # those ending at or after this end contain it
        below = stair[k - 1] + 1 if k else 0
        i = bisect_left(free, below)
        if i < len(free):
            lane = free.pop(i)
        else:  # containers sit in existing lanes, so below <= lanes
            lane = lanes
            lanes += 1
        heappush(used, (e, lane))
        out.append((r, lane))
        # its step: those ending no later with no higher lane are below it now
        j = bisect_left(neg_ends, -e)
        m = j
        while m < len(stair) and stair[m] <= lane:
            m += 1
        neg_ends[j:m] = [-e]
        stair[j:m] = [lane]
    return out


class _Track:
    """One thread of one rank: its ranges, laid out in lanes."""

    def __init__(self, pid: int, thread: int, ranges: list[RangeRecord]) -> None:
        self.pid, self.thread = pid, thread
        self.bars = assign_lanes(ranges)
        self.lanes = 1 + max((lane for _, lane in self.bars), default=0)


def _tracks(trace: RankTrace) -> list[_Track]:
    """The rank's threads (by process and thread id), in order of their first range."""
    by_thread: dict[tuple[int, int], list[RangeRecord]] = {}
    for r in sorted(trace.ranges, key=lambda r: r.start_ns):
        by_thread.setdefault((r.pid, r.thread), []).append(r)
    return [_Track(pid, thread, ranges) for (pid, thread), ranges in by_thread.items()]


def _paired(trace: RankTrace) -> RankTrace:
    """``X_start``/``X_stop`` marks drawn as the range ``X`` (see
    :mod:`mstx_marks.analysis.model.mark_pairs`)."""
    records = pair_marks(trace.records)
    return RankTrace(trace.rank, records, trace.steps, trace.source, trace.role)


def _text_width(text: str, font_px: float) -> float:
    """About the widest ``text`` is drawn in a sans-serif font of ``font_px`` (an SVG file has no
    text metrics of its own: the viewer's font decides; generous, for capitals)."""
    return len(text) * font_px * _EM_PER_CHAR


def _rank_label(row: ET.Element, label: str, y: float) -> None:
    """The rank's label at the top of its row, cut to the picture's width (whole on hover)."""
    fits = int((_WIDTH - _RIGHT - _LABEL_X) / (_LABEL_PX * _EM_PER_CHAR))
    text = ET.SubElement(row, "text", {"class": "rank-label", "x": str(_LABEL_X), "y": str(y + 12)})
    text.text = label if len(label) <= fits else label[: fits - 3] + "..."
    if text.text != label:
        ET.SubElement(text, "title").text = label


def _lane_labels(row: ET.Element, rank: int, tracks: list[_Track], tops: list[int]) -> None:
    """``thread T`` on each thread's first lane when the rank has several, ``lane K`` on the
    deeper lanes, right-aligned against the plot."""
    several_threads = len(tracks) > 1
    several_pids = len({t.pid for t in tracks}) > 1
    for track, top in zip(tracks, tops):
        # On a rank with one thread, its first lane is the rank's: the rank label says it.
        for lane in range(0 if several_threads else 1, track.lanes):
            if lane == 0:
                who = f"{track.pid}/{track.thread}" if several_pids else str(track.thread)
                text = f"thread {who}"
            else:
                text = f"lane {lane}"
            ET.SubElement(
                row,
                "text",
                {
                    "class": "lane-label",
                    "data-rank": str(rank),
                    "data-thread": str(track.thread),
                    "data-lane": str(lane),
                    "x": str(_LEFT - 4),
                    "y": str(top + lane * _LANE + 11),
                    "text-anchor": "end",
                },
            ).text = text


def _tick_step(span_ns: int) -> int:
    raw = span_ns / 6
    step = 1
    while step * 10 <= raw:
        step *= 10
    for mult in (1, 2, 5, 10):
        if step * mult >= raw:
            return step * mult
    return step * 10


def _time_label(ns: int) -> str:
    return f"{ns / 1e9:g} s" if ns >= 10**9 else f"{ns / 1e6:g} ms"


def _line(parent: ET.Element, cls: str, x1: float, x2: float, y1: float, y2: float) -> ET.Element:
    coords = {"x1": x1, "x2": x2, "y1": y1, "y2": y2}
    return ET.SubElement(parent, "line", {"class": cls, **{k: str(v) for k, v in coords.items()}})


def render_svg(
    traces: Sequence[RankTrace],
    name_of: Callable[[str], str] = str,
    title: str = "mstx_marks timeline",
    max_phases: int | None = MAX_PHASES,
    model: StepAnalysis | None = None,
) -> str:
    """The SVG document for ``traces``; ``name_of`` folds range names (colours and legend);
    ``model``: the summary's per-step model, whose steps are drawn and whose clock shifts place
    the ranks (the bars' ``data-start-ns`` and ``data-end-ns`` are then on its axis).

    Past ``max_phases`` names, the legend lists the ``max_phases`` of most total time, and the
    other phases are drawn in :data:`OTHER_COLOR` under one legend entry (their bars keep their
    names); ``None``: a colour and an entry for every name.

    >>> from mstx_marks.base.records import RangeRecord
    >>> t = RankTrace(0, [RangeRecord(f"op{i}", "default", i, 2 * i, 1, 1) for i in range(9)])
    >>> svg = render_svg([t], max_phases=3)
    >>> svg.count('class="legend-item"'), "(6 other phases)" in svg, svg.count('class="range"')
    (3, True, 9)
    """
    shifts = {} if model is None else model.clock.shifts_ns
    paired = (_paired(t) if model is not None else _paired(t).with_steps() for t in traces)
    traces = sorted(paired, key=lambda t: t.member)
    laid = [(t, _tracks(t)) for t in traces]
    every = [r for t in traces for r in t.ranges]
    placed = [(r.start_ns + shifts.get(t.member, 0), r.end_ns + shifts.get(t.member, 0))
              for t in traces for r in t.ranges]  # fmt: skip
    t0 = min((a for a, _ in placed), default=0)
    span = max(max((b for _, b in placed), default=t0) - t0, 1)
    plot_w = _WIDTH - _LEFT - _RIGHT
    any_open = any(r.open for r in every)

    def x(ns: int) -> float:
        return round(_LEFT + (ns - t0) * plot_w / span, 2)

    totals: dict[str, int] = {}
    for r in sorted(every, key=lambda r: r.start_ns):
        name = _xml_text(name_of(range_name(r.name, r.domain)))
        totals[name] = totals.get(name, 0) + r.end_ns - r.start_ns
    listed = list(totals)  # by first start
    if max_phases is not None and len(listed) > max_phases:
        longest = sorted(range(len(listed)), key=lambda i: (-totals[listed[i]], i))[:max_phases]
        listed = [listed[i] for i in sorted(longest)]
    colors = {name: phase_color(name) for name in listed}
    folded = len(totals) - len(listed)

    svg = ET.Element("svg", xmlns="http://www.w3.org/2000/svg", width=str(_WIDTH))
    ET.SubElement(svg, "style").text = (
        "text{font:12px sans-serif;fill:#222}.axis{stroke:#999}.step{stroke:#333;"
        "stroke-dasharray:4 3}rect.range{stroke:#fff;stroke-width:0.3}"
        "rect.range[data-open]{stroke:#111;stroke-width:1;stroke-dasharray:3 2}"
        ".open-hatch{fill:url(#open-hatch);pointer-events:none}"
        "text.lane-label{font-size:9px;fill:#666}"
    )
    if any_open:
        defs = ET.SubElement(svg, "defs")
        pattern = ET.SubElement(
            defs,
            "pattern",
            id="open-hatch",
            width="6",
            height="6",
            patternUnits="userSpaceOnUse",
            patternTransform="rotate(45)",
        )
        stripe = {"x1": "0", "y1": "0", "x2": "0", "y2": "6", "stroke": "#000"}
        ET.SubElement(pattern, "line", {**stripe, "stroke-width": "2", "stroke-opacity": "0.45"})
    ET.SubElement(svg, "text", x=str(_LEFT), y="22", style="font-size:15px").text = _xml_text(title)
    y = _TOP
    for trace, tracks in laid:
        if not tracks:
            tracks = [_Track(0, 0, [])]
        label = _xml_text(trace.member.label)  # by role, then rank
        # The rank's label has a line of its own above the tracks when it would meet a thread's
        # label or the bars on their first lane (a long role name runs past the label column).
        header = len(tracks) > 1 or _text_width(label, _LABEL_PX) > _LEFT - 2 * _LABEL_X
        tops, height = [], _LANE if header else 0
        for track in tracks:
            tops.append(y + height)
            height += track.lanes * _LANE + _TRACK_GAP
        height -= _TRACK_GAP
        row = ET.SubElement(
            svg,
            "g",
            {
                "class": "rank",
                "data-rank": str(trace.rank),
                **({"data-role": trace.role} if trace.role else {}),
            },
        )
        _rank_label(row, label, y)
        _lane_labels(row, trace.rank, tracks, tops)
        bars = [(r, lane, top) for track, top in zip(tracks, tops) for r, lane in track.bars]
        d = shifts.get(trace.member, 0)
        for r, lane, top in sorted(bars, key=lambda b: (b[0].start_ns, -b[0].end_ns)):
            name = _xml_text(name_of(range_name(r.name, r.domain)))
            start, end = r.start_ns + d, r.end_ns + d
            geometry = {
                "x": str(x(start)),
                "y": str(top + lane * _LANE),
                "width": str(round(max(x(end) - x(start), MIN_BAR_PX), 2)),
                "height": str(_LANE - 2),
            }
            attrs = {
                "class": "range",
                "data-rank": str(trace.rank),
                "data-thread": str(r.thread),
                "data-lane": str(lane),
                "data-name": name,
                "data-start-ns": str(start),
                "data-end-ns": str(end),
                **geometry,
                "fill": colors.get(name, OTHER_COLOR),
            }
            if r.open:
                attrs["data-open"] = "true"
            bar = ET.SubElement(row, "rect", attrs)
            tip = (
                f"{_xml_text(r.name)} ({_xml_text(trace.member.label)}): "
                f"{(r.end_ns - r.start_ns) / 1e6:.3f} ms, thread {r.thread}"
            )
            if r.open:
                tip += ", open: still running when read (drawn up to the read)"
            ET.SubElement(bar, "title").text = tip
            if r.open:
                ET.SubElement(row, "rect", {"class": "open-hatch", **geometry})
        marks = (
            [(s, str(i)) for i, (s, _) in enumerate(trace.steps, start=1)]
            if model is None
            else [(st.start_ns, st.key) for st in model.steps]
        )
        for at, key in marks:
            _line(row, "step", x(at), x(at), y - 4, y + height).set("data-step", _xml_text(key))
            step_label = ET.SubElement(row, "text", x=str(x(at) + 2), y=str(y - 1))
            step_label.set("style", "font-size:9px")
            step_label.text = _xml_text(f"step {key}")
        y += height + _ROW_GAP + 8

    axis = ET.SubElement(svg, "g", {"class": "time-axis"})
    _line(axis, "axis", _LEFT, _LEFT + plot_w, y, y)
    tick = _tick_step(span)
    for t in range(0, span + 1, tick):
        _line(axis, "axis", x(t0 + t), x(t0 + t), y, y + 5)
        tick_label = ET.SubElement(axis, "text", {"x": str(x(t0 + t)), "y": str(y + 18)})
        tick_label.set("text-anchor", "middle")
        tick_label.text = _time_label(t)
    y += _AXIS

    legend = ET.SubElement(svg, "g", {"class": "legend"})
    lx = float(_LEFT)
    items = [(name, color, "legend-item") for name, color in colors.items()]
    if folded:
        other = f"({folded:,} other phase{'s' * (folded != 1)})"
        items.append((other, OTHER_COLOR, "legend-other"))
    if any_open:
        items.append(("open: still running when read", "#bbb", "legend-open"))
    for name, color, cls in items:
        item_w = 24 + 7 * len(name)
        if lx + item_w > _WIDTH - _RIGHT:
            lx, y = float(_LEFT), y + _LEGEND_ROW
        item = ET.SubElement(legend, "g", {"class": cls, "data-name": name})
        box = {"x": str(lx), "y": str(y), "width": "12", "height": "12"}
        ET.SubElement(item, "rect", {**box, "fill": color})
        if cls == "legend-open":
            ET.SubElement(item, "rect", {"class": "open-hatch", **box})
        ET.SubElement(item, "text", x=str(lx + 16), y=str(y + 11)).text = name
        lx += item_w
    svg.set("height", str(y + _LEGEND_ROW + 10))
    svg.set("viewBox", f"0 0 {_WIDTH} {y + _LEGEND_ROW + 10}")
    return ET.tostring(svg, encoding="unicode")


def write_svg(
    path: str | Path,
    traces: Sequence[RankTrace],
    name_of: Callable[[str], str] = str,
    *,
    max_phases: int | None = MAX_PHASES,
    model: StepAnalysis | None = None,
) -> Path:
    """Write :func:`render_svg` of ``traces`` to ``path`` atomically and return the path."""
    svg = render_svg(traces, name_of, max_phases=max_phases, model=model)
    return atomic_write_bytes(path, svg.encode())
