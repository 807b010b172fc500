"""The HTML report, checked as data and in a real headless Chromium (Debian's ``chromium``):
loaded from a file, rendered without console errors, and screenshotted."""

from __future__ import annotations

import json
import re
import struct
import zlib
from pathlib import Path

import pytest
from support.chromium import page_errors, rendered, run_chromium
from support.recorded import PID, T0, TID, rng, synthetic_rank

from mstx_marks.analysis.render.report_html import MIN_BAR_PX, render_html, report_data
from mstx_marks.analysis.summary import summarize
from mstx_marks.base.records import RangeRecord
from mstx_marks.cli.main import main as cli_main
from mstx_marks.export import RankTrace, export_rank


def _traces() -> list[RankTrace]:
    a = synthetic_rank(0, steps=3, tokens=4)
    b = synthetic_rank(1, steps=3, tokens=4, slow=400)
    b.role = "rollout"
    # a phase far shorter than a pixel, with args, and an open range
    a.records.append(RangeRecord("reward", "default", T0 + 500, T0 + 501, TID, PID,
                                 args={"tokens": 12, "note": "</script><b>x</b>"}))  # fmt: skip
    a.records.append(rng("update_actor", 2500, 3000, open=True))
    return [a, b]


def _data(page: str) -> dict[str, object]:
    m = re.search(r"<script type='application/json' id='data'>(.*?)</script>", page, re.S)
    assert m, "the data block is in the page"
    data: dict[str, object] = json.loads(m.group(1).replace("<\\/", "</"))
    return data


def test_the_page_holds_everything_and_fetches_nothing() -> None:
    traces = _traces()
    summary = summarize(traces)
    page = render_html(traces, summary)
    assert not re.search(r"(src|href)\s*=|https?://|@import|fetch\(", page)
    assert "<b>x</b>" not in page  # a name or arg can never become markup
    data = _data(page)
    assert data["ranks"] == [0, 1] and data["left_out"] == 0
    names = data["names"]
    assert isinstance(names, list) and "reward" in names
    bars = data["bars"]
    assert isinstance(bars, list) and len(bars) == sum(len(t.ranges) for t in traces)
    reward = next(b for b in bars if names[b[3]] == "reward")
    assert reward[2] == 0.001  # 1 ns in microseconds: drawn MIN_BAR_PX wide all the same
    assert json.loads(data["args"][reward[4]]) == {"tokens": 12, "note": "</script><b>x</b>"}  # type: ignore[index]
    assert MIN_BAR_PX >= 1
    assert any(b[5] == 1 for b in bars)  # the open range is flagged
    phases = {p["name"]: p for p in data["phases"]}  # type: ignore[union-attr]
    assert phases["update_actor"]["slowest"] == 1
    # the job's steps: the per-step model's (its reference's), not found again
    model = summary.per_step
    assert model is not None
    start = [round((s.start_ns - data["origin_ns"]) / 1000, 3) for s in model.steps]  # type: ignore[operator]
    assert data["steps"] == [list(x) for x in zip(start, ["1", "2", "3"])]
    groups = data["groups"]
    assert [(g["rank"], g["role"]) for g in groups] == [(0, ""), (1, "rollout")]  # type: ignore[index,union-attr]


def test_nested_ranges_sit_below_what_contains_them() -> None:
    data = report_data([synthetic_rank(0, steps=1)], summarize([synthetic_rank(0, steps=1)]))
    names = data["names"]
    lane = {names[b[3]]: b[0] for b in data["bars"]}
    assert lane["step"] < lane["generate_sequences"] < lane["vllm_one_step"]


def _png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and rows (RGB(A) bytes) of an 8-bit PNG, decoded with the standard library."""
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(raw):
        (length,) = struct.unpack(">I", raw[pos : pos + 4])
        kind, body = raw[pos + 4 : pos + 8], raw[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    data = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = (
            data[y * (stride + 1)],
            bytearray(data[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 255
        rows.append(bytes(line))
        prev = line
    return width, bpp, rows


def test_the_error_catcher_notes_every_kind_of_script_failure(tmp_path: Path) -> None:
    """The checks of the Chromium tests can fail: a page with a script error, a syntax error,
    a rejected promise or a console.error is caught (and a clean page is not)."""
    traces = _traces()
    page = render_html(traces, summarize(traces))
    clean = tmp_path / "clean.html"
    clean.write_text(page)
    assert page_errors(rendered(clean, tmp_path)) is None
    for bad, said in [
        ("null.x()", "null"),
        ("const = ;", "SyntaxError"),
        ("Promise.reject('lost')", "unhandled rejection: lost"),
        ("console.error('drawn wrong', 3)", "drawn wrong 3"),
    ]:
        broken = tmp_path / "broken.html"
        broken.write_text(page.replace("</body>", f"<script>{bad}</script></body>"))
        run = run_chromium(tmp_path, "--dump-dom", broken.as_uri())
        assert said in (page_errors(run.stdout) or ""), (bad, run.stdout[-500:])


def test_the_report_renders_in_headless_chromium(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = synthetic_rank(2, steps=3, tokens=4)  # a second rollout rank: an imbalance to show
    c.role = "rollout"
    for t in [*_traces(), c]:
        export_rank(tmp_path / "run", t)
    report = tmp_path / "report.html"
    assert cli_main(["summary", str(tmp_path / "run"), "--html", str(report)]) == 0
    assert f"html: {report}" in capsys.readouterr().err
    dom = rendered(report, tmp_path)
    drawn = re.search(r'data-drawn="(\d+)"', dom)
    assert drawn and int(drawn.group(1)) > 20
    assert dom.count("<th ") + dom.count("<th>") >= 10  # the table was built
    assert "slowest rank 1" in dom  # imbalance names the slowest rank
    assert re.search(r'data-marks="[1-9]', dom)  # the instants are drawn
    assert "(unmarked)" in dom and "self %" in dom

    png = tmp_path / "report.png"
    shot = run_chromium(tmp_path, f"--screenshot={png}", report.as_uri())
    assert shot.returncode == 0 and png.is_file(), shot.stderr[-2000:]
    width, bpp, rows = _png_pixels(png)
    assert width == 1400 and len(rows) == 900
    background = bytes([255] * bpp)
    colored = sum(
        1
        for row in rows[::4]
        for x in range(0, len(row), bpp * 4)
        if row[x : x + bpp] != background and len(set(row[x : x + 3])) > 1
    )
    assert colored > 500, "the timeline's coloured bars are on the screenshot"


def test_a_page_of_folded_phases_renders_its_legend_and_table_in_chromium(
    tmp_path: Path,
) -> None:
    """Past the cut, the legend and the table end with one entry for the other phases, drawn
    grey; the page renders as before."""
    trace = synthetic_rank(0, steps=3, tokens=4)
    trace.records += [rng(f"op_{i}", 3100 + 10 * i, 3105 + 10 * i) for i in range(30)]
    page = tmp_path / "report.html"
    page.write_text(render_html([trace], summarize([trace]), max_phases=5))
    dom = rendered(page, tmp_path)
    legend = re.search(r"<div class=\"legend\" id=\"legend\">(.*?)</div>", dom, re.S)
    # the 5 longest, the step, the instant, the others
    assert legend and legend.group(1).count("<span>") == 5 + 1 + 1 + 1
    assert "(28 other phases)" in legend.group(1)  # of 33: gen, its decodes, update, 30 ops
    row = r'<tr class="other"><td class="name"[^>]*>\(28 other phases\)</td><td>all</td><td>28<'
    assert re.search(row, dom)


def test_only_an_imbalance_past_noise_is_painted_red(tmp_path: Path) -> None:
    """Three ranks of one role: gen 1.02x (noise: said so, no red), update_actor 1.5x (red)."""
    traces = []
    for rank, (gen, update) in enumerate([(1000, 1000), (1010, 1000), (1020, 1500)]):
        recs = [rng("step", 0, 3000), rng("gen", 0, gen), rng("update_actor", 1100, 1100 + update)]
        traces.append(RankTrace(rank, recs, role="worker"))
    page = tmp_path / "report.html"
    page.write_text(render_html(traces, summarize(traces)))
    dom = rendered(page, tmp_path)
    cards = re.findall(r'<div class="card" data-flagged="(\d)"><div>([^<]*)</div>(.*?)</div></div>'
                       r'<div class="xaxis"', dom)  # fmt: skip
    said = {text.split(":")[0].split()[-1]: (flag, text, bars) for flag, text, bars in cards}
    assert set(said) == {"step", "generate_sequences", "update_actor"}  # (steps of 1.00x)
    flag, text, bars = said["generate_sequences"]
    assert flag == "0" and "1.02x the fastest" in text and "within noise (under 1.10x)" in text
    assert 'class="slow"' not in bars and bars.count('class="slowest"') == 1
    flag, text, bars = said["update_actor"]
    assert flag == "1" and "1.50x" in text and "noise" not in text
    assert bars.count('class="slow"') == 1
    assert "red: the slowest, from 1.10x the fastest" in dom
