"""The HTML report's style and scripts are package data (mstx_marks/analysis/render/report/):
inlined
verbatim into each page, parsed by node (its syntax check: the one JavaScript tool that runs
offline here), and shipped in the wheel and the sdist, where an installed copy finds them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from support.recorded import synthetic_rank

from mstx_marks.analysis.render import report_html
from mstx_marks.analysis.render.report_html import ASSETS, asset, render_html
from mstx_marks.analysis.summary import summarize

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "mstx_marks" / "analysis" / "render" / "report"


def test_every_file_of_the_folder_is_inlined_verbatim_into_the_page() -> None:
    assert sorted(ASSETS) == sorted(p.name for p in FOLDER.iterdir() if p.suffix in (".js", ".css"))
    traces = [synthetic_rank(0, steps=2)]
    page = render_html(traces, summarize(traces))
    for name in ASSETS:
        text = (FOLDER / name).read_text(encoding="utf-8")
        assert asset(name) == text
        assert page.count(text) == 1, name


def test_a_file_that_could_end_its_block_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "bad.js").write_text("const s = '</script>';\n")
    (tmp_path / "report" / "good.js").write_text("const s = '<' + '/script>';\n")
    monkeypatch.setattr(report_html, "files", lambda _package: tmp_path)
    asset.cache_clear()
    try:
        assert asset("good.js") == "const s = '<' + '/script>';\n"
        with pytest.raises(ValueError, match="cannot be inlined"):
            asset("bad.js")
    finally:
        asset.cache_clear()


def _node() -> str:
    found = shutil.which("node")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("node is not installed, and CI must check the report's scripts")
        pytest.skip("needs node (Debian's nodejs) for its syntax check")
    return found


@pytest.mark.parametrize("name", [n for n in ASSETS if n.endswith(".js")])
def test_each_script_parses_and_runs_in_strict_mode(name: str, tmp_path: Path) -> None:
    node = _node()
    path = FOLDER / name
    check = subprocess.run([node, "--check", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert "'use strict';" in path.read_text(encoding="utf-8")  # undeclared names throw
    # The check can fail: the same file with a syntax error is refused.
    broken = tmp_path / name
    broken.write_text(path.read_text(encoding="utf-8") + "\nconst = ;\n")
    assert subprocess.run([node, "--check", str(broken)], capture_output=True).returncode != 0


def _copy_project(to: Path) -> None:
    """What the build reads (not the tests, docs and benchmarks): a build here leaves nothing
    in the working tree other sessions use."""
    for name in ("pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "CHANGELOG.md"):
        shutil.copy(ROOT / name, to / name)
    shutil.copytree(
        ROOT / "mstx_marks", to / "mstx_marks", ignore=shutil.ignore_patterns("__pycache__")
    )


def test_the_wheel_and_the_sdist_ship_the_files_and_an_installed_copy_reads_them(
    tmp_path: Path,
) -> None:
    src, dist = tmp_path / "src", tmp_path / "dist"
    src.mkdir()
    _copy_project(src)
    build = subprocess.run(
        [sys.executable, "-c",
         "import sys; from setuptools import build_meta as b;"
         " out = sys.argv[1]; w = b.build_wheel(out); s = b.build_sdist(out); print('built', w, s)",
         str(dist)],
        cwd=src, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    (built,) = [line for line in build.stdout.splitlines() if line.startswith("built ")]
    wheel_name, sdist_name = built.split()[1:]
    wanted = {f"mstx_marks/analysis/render/report/{n}" for n in ASSETS}
    with zipfile.ZipFile(dist / wheel_name) as zf:
        assert wanted <= set(zf.namelist())
        site = tmp_path / "site"
        zf.extractall(site)
    with tarfile.open(dist / sdist_name) as tar:
        assert wanted <= {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    # The installed copy (not this checkout: PYTHONPATH first, run from elsewhere) finds them.
    probe = (
        "import json, mstx_marks\n"
        "from mstx_marks.analysis.render.report_html import ASSETS, render_html\n"
        "from mstx_marks.analysis.summary import summarize\n"
        "from mstx_marks.base.records import RangeRecord, RankTrace\n"
        "t = [RankTrace(0, [RangeRecord('gen', 'default', 0, 5, 1, 1)])]\n"
        "page = render_html(t, summarize(t))\n"
        "print(json.dumps([mstx_marks.__file__, page]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    where, page = json.loads(run.stdout)
    assert Path(where).is_relative_to(site)
    for name in ASSETS:
        assert (FOLDER / name).read_text(encoding="utf-8") in page, name
