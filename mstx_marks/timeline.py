"""A timeline picture of recorded ranges: plain SVG, built with the standard library.

One row per rank; inside a row, ranges nested in others go one lane lower, so a step, its phases
and their sub-phases stack up. Each phase name has one colour (see the legend), step starts are
dashed lines, and hovering a bar shows its name and duration. Bars are ``<rect class="range">``
with ``data-rank``, ``data-name``, ``data-start-ns`` and ``data-end-ns``, so the file can be
checked as data as well as looked at.

>>> from mstx_marks.records import RangeRecord
>>> from mstx_marks.export import RankTrace
>>> svg = render_svg([RankTrace(0, [RangeRecord("gen", "default", 0, 5, 1, 1)])])
>>> svg.startswith("<svg") and svg.count('class="range"')
1
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path
from typing import Callable, Sequence

from .export import atomic_write_bytes
from .records import RangeRecord, RankTrace

__all__ = ["render_svg", "write_svg"]

_WIDTH = 1400
_LEFT = 90
_RIGHT = 20
_TOP = 40
_LANE = 16
_ROW_GAP = 12
_AXIS = 36
_LEGEND_ROW = 20
_PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
    "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#d62728",
)  # fmt: skip
# Characters XML 1.0 cannot hold (ElementTree writes them as they are, making the file unreadable);
# range names may contain them, as may lone surrogates, which cannot even be encoded.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def _color(index: int, name: str) -> str:
    if index < len(_PALETTE):
        return _PALETTE[index]
    return f"hsl({zlib.crc32(name.encode()) % 360}, 55%, 55%)"


def _lanes(ranges: list[RangeRecord]) -> list[tuple[RangeRecord, int]]:
    """Each range with its nesting depth (by time, as msprof-analyze nests), in start order."""
    out: list[tuple[RangeRecord, int]] = []
    open_ends: list[int] = []
    for r in sorted(ranges, key=lambda r: (r.start_ns, -r.end_ns)):
        while open_ends and open_ends[-1] < r.end_ns:
            open_ends.pop()
        out.append((r, len(open_ends)))
        open_ends.append(r.end_ns)
    return out


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
) -> str:
    """The SVG document for ``traces``; ``name_of`` folds range names (colours and legend)."""
    traces = sorted((t.with_steps() for t in traces), key=lambda t: t.rank)
    laid = [(t, _lanes(t.ranges)) for t in traces]
    ends = [r.end_ns for _, bars in laid for r, _ in bars]
    t0 = min((r.start_ns for _, bars in laid for r, _ in bars), default=0)
    span = max(max(ends, default=t0) - t0, 1)
    plot_w = _WIDTH - _LEFT - _RIGHT

    def x(ns: int) -> float:
        return round(_LEFT + (ns - t0) * plot_w / span, 2)

    colors: dict[str, str] = {}
    for _, bars in laid:
        for r, _ in bars:
            name = _xml_text(name_of(r.name))
            colors.setdefault(name, _color(len(colors), name))

    svg = ET.Element("svg", xmlns="http://www.w3.org/2000/svg", width=str(_WIDTH))
    ET.SubElement(svg, "style").text = (
        "text{font:12px sans-serif;fill:#222}.axis{stroke:#999}.step{stroke:#333;"
        "stroke-dasharray:4 3}rect.range{stroke:#fff;stroke-width:0.3}"
    )
    ET.SubElement(svg, "text", x=str(_LEFT), y="22", style="font-size:15px").text = _xml_text(title)
    y = _TOP
    for trace, bars in laid:
        lanes = 1 + max((depth for _, depth in bars), default=0)
        height = lanes * _LANE
        row = ET.SubElement(svg, "g", {"class": "rank", "data-rank": str(trace.rank)})
        ET.SubElement(
            row, "text", x="8", y=str(y + min(height, 2 * _LANE) / 2 + 4)
        ).text = f"rank {trace.rank}"
        for r, depth in bars:
            name = _xml_text(name_of(r.name))
            bar = ET.SubElement(
                row,
                "rect",
                {
                    "class": "range",
                    "data-rank": str(trace.rank),
                    "data-name": name,
                    "data-start-ns": str(r.start_ns),
                    "data-end-ns": str(r.end_ns),
                    "x": str(x(r.start_ns)),
                    "y": str(y + depth * _LANE),
                    "width": str(max(x(r.end_ns) - x(r.start_ns), 0.5)),
                    "height": str(_LANE - 2),
                    "fill": colors[name],
                },
            )
            ET.SubElement(
                bar, "title"
            ).text = (
                f"{_xml_text(r.name)} (rank {trace.rank}): {(r.end_ns - r.start_ns) / 1e6:.3f} ms"
            )
        for i, (start, _) in enumerate(trace.steps, start=1):
            _line(row, "step", x(start), x(start), y - 4, y + height).set("data-step", str(i))
            label = ET.SubElement(row, "text", x=str(x(start) + 2), y=str(y - 1))
            label.set("style", "font-size:9px")
            label.text = f"step {i}"
        y += height + _ROW_GAP + 8

    axis = ET.SubElement(svg, "g", {"class": "time-axis"})
    _line(axis, "axis", _LEFT, _LEFT + plot_w, y, y)
    tick = _tick_step(span)
    for t in range(0, span + 1, tick):
        _line(axis, "axis", x(t0 + t), x(t0 + t), y, y + 5)
        label = ET.SubElement(axis, "text", {"x": str(x(t0 + t)), "y": str(y + 18)})
        label.set("text-anchor", "middle")
        label.text = _time_label(t)
    y += _AXIS

    legend = ET.SubElement(svg, "g", {"class": "legend"})
    lx = float(_LEFT)
    for name, color in colors.items():
        item_w = 24 + 7 * len(name)
        if lx + item_w > _WIDTH - _RIGHT:
            lx, y = float(_LEFT), y + _LEGEND_ROW
        item = ET.SubElement(legend, "g", {"class": "legend-item", "data-name": name})
        ET.SubElement(item, "rect", x=str(lx), y=str(y), width="12", height="12", fill=color)
        ET.SubElement(item, "text", x=str(lx + 16), y=str(y + 11)).text = name
        lx += item_w
    svg.set("height", str(y + _LEGEND_ROW + 10))
    svg.set("viewBox", f"0 0 {_WIDTH} {y + _LEGEND_ROW + 10}")
    return ET.tostring(svg, encoding="unicode")


def write_svg(
    path: str | Path, traces: Sequence[RankTrace], name_of: Callable[[str], str] = str
) -> Path:
    """Write :func:`render_svg` of ``traces`` to ``path`` atomically and return the path."""
    return atomic_write_bytes(path, render_svg(traces, name_of).encode())
