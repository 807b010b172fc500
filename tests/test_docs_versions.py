"""Issue 37, item 5: the presets page and the compatibility page say the same versions, because
both are generated from one table, the presets' own ``versions`` rows (``TARGETS``). Read from
the pages as a reader sees them (the generated blocks are kept in the markdown)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mstx_marks.capture.presets import FRAMEWORKS, targets

DOCS = Path(__file__).resolve().parents[1] / "docs" / "reference"
#: A version as the pages write them: 0.11, 0.7.1 (not a lone digit: "depth 4", "8 ranks").
VERSION = re.compile(r"(?<![\w.])\d+\.\d+(?:\.\d+)?(?![\w])")


def _rows(page: str) -> dict[str, list[list[str]]]:
    """Each table row of ``page`` by its preset (first cell), split into cells (``\\|`` is a
    pipe inside a cell)."""
    rows: dict[str, list[list[str]]] = {}
    for line in (DOCS / page).read_text(encoding="utf-8").splitlines():
        found = re.match(r"\| `(\w+)`", line)
        if found is None:
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows.setdefault(found.group(1), []).append(cells)
    return rows


@pytest.mark.parametrize("preset", FRAMEWORKS)
def test_both_pages_name_the_versions_of_the_presets_one_table(preset: str) -> None:
    table = {t.versions for t in targets(preset)}
    compatibility = {cells[1] for cells in _rows("compatibility.md")[preset]}
    (row,) = _rows("presets.md")[preset]
    assert compatibility == table
    assert set(row[1].split("; ")) == table
    # Nothing else on the presets page's row names a version the table does not have: a
    # hand-written range ("vllm-ascend 0.11-0.23") drifts from the code's.
    known = {v for text in table for v in VERSION.findall(text)}
    assert set(VERSION.findall(" ".join(row))) <= known, row
