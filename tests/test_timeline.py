from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support.recorded import synthetic_rank

from mstx_marks.timeline import render_svg, write_svg

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
