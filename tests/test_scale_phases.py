"""A run of many distinct phase names (issue 27's 50,000; here 10,000): the table, the HTML
report and the SVG legend show the largest phases and one counted row for the rest; the JSON and
CSV keep every phase. The time and page size at 50,000 names: ``python3
benchmarks/summary_names.py --check``."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from mstx_marks.analysis.model.top_phases import MAX_PHASES
from mstx_marks.analysis.render.report_html import report_data
from mstx_marks.analysis.render.timeline import render_svg
from mstx_marks.analysis.summary import format_table, run_summary, summarize
from mstx_marks.base.records import RangeRecord, RankTrace
from mstx_marks.export.chrome import write_chrome_trace

T0 = 1_700_000_000_000_000_000


def many_names(n: int, steps: int = 10) -> RankTrace:
    """``steps`` steps, ``n`` ranges in all, each of its own name (a name per kernel launch),
    ``op_<i>`` lasting 100 + i % 997 ns: the longest are known."""
    recs = []
    t, per = 0, n // steps
    for s in range(steps):
        start = t
        for i in range(s * per, (s + 1) * per):
            recs.append(RangeRecord(f"op_{i:06d}", "default", T0 + t, T0 + t + 100 + i % 997, 1, 1))
            t += 1200
        recs.append(RangeRecord("step", "default", T0 + start, T0 + t, 1, 1))
        t += 10
    return RankTrace(0, sorted(recs, key=lambda r: r.start_ns))


def _data(page: str) -> dict[str, object]:
    m = re.search(r"<script type='application/json' id='data'>(.*?)</script>", page, re.S)
    assert m
    data: dict[str, object] = json.loads(m.group(1))
    return data


#: Distinct names in the test; bytes of page each may cost, drawn (a bar each) or folded. Before
#: (each phase a table row, a colour and a legend entry), 50,000 names made a 24.6 MB page (490
#: bytes a name) that took headless Chromium 75 s to open, and 11.2 MB of table on stdout; now
#: 6.0 MB (120 bytes a name, measured) and 50 kB.
NAMES, PAGE_BYTES_PER_NAME = 10_000, 200


def test_many_names_make_a_small_page_and_a_short_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_chrome_trace(tmp_path / "run" / "rank0.trace.json", [many_names(NAMES)])
    page = tmp_path / "report.html"
    assert run_summary(str(tmp_path / "run"), html=str(page)) == 0
    out = capsys.readouterr().out
    assert page.stat().st_size < NAMES * PAGE_BYTES_PER_NAME, page.stat().st_size
    assert len(out.encode()) < 200_000, len(out.encode())  # the 200 rows shown, whatever NAMES
    # the 200 longest phases, then the rest summed in one counted row
    folded = NAMES - MAX_PHASES
    assert re.search(rf"\({folded:,} other phases\) +all +{folded} ", out), out[-3000:]
    rows = [line for line in out.splitlines() if re.match(r"op_\d+ +all ", line)]
    assert len(rows) == MAX_PHASES
    data = _data(page.read_text())
    assert len(data["phases"]) == MAX_PHASES + 1  # type: ignore[arg-type]  # and the step
    (other,) = data["others"]  # type: ignore[misc]
    assert other["phases"] == folded and other["count"] == folded
    assert len(data["colors"]) == MAX_PHASES + 1 and data["folded"] == folded  # type: ignore[arg-type]
    assert len(data["bars"]) == NAMES + 10  # type: ignore[arg-type]  # every range still drawn


def test_the_rows_shown_are_the_longest_and_the_rest_add_up() -> None:
    trace = many_names(3000)
    summary = summarize([trace])
    text = format_table(summary, max_phases=50)
    shown = {line.split()[0] for line in text.splitlines() if re.match(r"op_\d+ +all ", line)}
    by_total = sorted((p for p in summary.phases if not p.is_step),
                      key=lambda p: -p.overall.total_ns)  # fmt: skip
    assert {p.name for p in by_total[:50]} == shown
    rest = by_total[50:]
    row = next(line for line in text.splitlines() if line.startswith("(2,950 other phases)"))
    total_ms = sum(p.overall.total_ns for p in rest) / 1e6
    assert row.split()[4:6] == [str(len(rest)), f"{total_ms:.3f}"], row
    assert "--all-phases lists them" in text


def test_every_phase_when_asked_and_always_in_json_and_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_chrome_trace(tmp_path / "rank0.trace.json", [many_names(300)])
    assert run_summary(str(tmp_path), all_phases=True) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if re.match(r"op_\d+ +all ", line)]) == 300
    assert "other phases" not in out
    assert run_summary(str(tmp_path), "json") == 0
    phases = json.loads(capsys.readouterr().out)["phases"]
    assert len([p for p in phases if p["name"].startswith("op_")]) == 300
    assert run_summary(str(tmp_path), "csv") == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len({r["phase"] for r in rows if r["phase"].startswith("op_")}) == 300


def test_the_html_and_svg_colour_and_list_the_shown_phases_only() -> None:
    trace = many_names(300)
    summary = summarize([trace])
    data = report_data([trace], summary)
    names, colors = data["names"], data["colors"]
    shown = {p["name"] for p in data["phases"]}
    assert set(names[: len(colors)]) == shown and data["folded"] == 100
    assert len(names) == 301  # a grey bar's name still shows on hover
    assert [o["name"] for o in data["others"]] == ["(100 other phases)"]
    every = report_data([trace], summary, max_phases=None)
    assert len(every["colors"]) == 301 and every["others"] == [] and every["folded"] == 0
    svg = render_svg([trace])
    assert svg.count('class="legend-item"') == MAX_PHASES and "(101 other phases)" in svg
    assert svg.count('class="range"') == 310  # every bar, the grey ones named
    assert render_svg([trace], max_phases=None).count('class="legend-item"') == 301
