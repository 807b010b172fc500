"""Headless Chromium (Debian's ``chromium``) for the HTML report's tests: load a page from a
file, run its scripts, and read back the DOM they built, failing on any error the page's catcher
(mstx_marks/analysis/render/report/errors.js) or the console saw."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

#: A fixed window, and time for the page's scripts to run.
FLAGS = ["--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
         "--window-size=1400,900", "--virtual-time-budget=3000"]  # fmt: skip


def chromium() -> str:
    """Chromium's path; a skip outside CI when it is missing, a failure inside CI."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed, and CI must run this test (see .ci/run)")
        pytest.skip("needs headless chromium (apt-get install -y chromium)")
    return found


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Chromium with :data:`FLAGS`, its console on stderr, its profile under ``tmp_path``."""
    home = tmp_path / "home"  # not in the user's home
    return subprocess.run(
        [chromium(), *FLAGS, "--enable-logging=stderr", "--v=0", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(home)},
    )  # fmt: skip


def page_errors(dom: str) -> str | None:
    """What the page's error catcher noted: uncaught errors (a script's syntax error too),
    rejected promises, console.error; None when nothing."""
    m = re.search(r'<html[^>]*data-errors="([^"]*)"', dom)
    return None if m is None else html.unescape(m.group(1))


def rendered(page: Path, tmp_path: Path) -> str:
    """The DOM of ``page`` once its scripts ran, which must have drawn every part of it (the
    timeline's and the pipeline view's scripts each say so when done) with no error caught and
    none on the console."""
    run = run_chromium(tmp_path, "--dump-dom", page.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    assert page_errors(run.stdout) is None, page_errors(run.stdout)
    assert 'data-rendered="ok"' in run.stdout, run.stderr[-2000:]
    assert 'data-pipeline="ok"' in run.stdout, run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if "CONSOLE" in line]
    assert not [line for line in console if "Uncaught" in line or "rror" in line], console
    return run.stdout


class SvgShapes(HTMLParser):
    """The pipeline view's shapes in a dumped DOM: each ``rect``, ``text`` and step ``g`` of
    ``svg#pipesvg`` as its attributes, a rect's or text's ``<title>`` and words under
    ``"title"`` and ``"text"``; ``svg`` the element's own attributes."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.svg: dict[str, str] = {}
        self.rects: list[dict[str, str]] = []
        self.texts: list[dict[str, str]] = []
        self.steps: list[dict[str, str]] = []
        self._inside = False
        self._last: dict[str, str] | None = None
        self._field = ""
        self.feed(dom)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "svg" and a.get("id") == "pipesvg":
            self.svg, self._inside = a, True
        elif not self._inside:
            return
        elif tag == "rect" and a.get("class"):
            self.rects.append(a)
            self._last = a
        elif tag == "text":
            self.texts.append(a)
            self._last, self._field = a, "text"
        elif tag == "g" and a.get("class") == "step":
            self.steps.append(a)
        elif tag == "title":
            self._field = "title"

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._inside = False
        elif tag in ("title", "text"):
            self._field = ""

    def handle_data(self, data: str) -> None:
        if self._inside and self._field and self._last is not None:
            self._last[self._field] = self._last.get(self._field, "") + data

    def of(self, cls: str) -> list[dict[str, str]]:
        """The rects whose class is ``cls``."""
        return [r for r in self.rects if r["class"] == cls]
