"""The process's one state object: what starting over forgets and keeps, for a test's reset and
in a forked child (the one method for both: ``PROCESS.start_over``)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

import mstx_marks
from mstx_marks import configure, mark
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.core.gates import gate
from mstx_marks.core.process import PROCESS
from mstx_marks.export import flush_at_exit


def test_starting_over_forgets_settings_recorder_session_and_warnings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(backend="record", include=["verl"])
    g = gate("verl")
    flush_at_exit(tmp_path)
    with mark("kept", domain="verl"):
        pass
    assert len(PROCESS.recorder.records()) == 1 and PROCESS.session is not None
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        warn_once("k", "first")
        PROCESS.start_over()
        warn_once("k", "again")  # forgotten: said again
    assert [str(w.message).endswith(("first", "again")) for w in said] == [True, True]
    assert PROCESS.settings.explicit == {} and not PROCESS.settings.resolved
    assert PROCESS.session is None and PROCESS.recorder.records() == []
    # A gate made before is routed again from what is asked now: the environment.
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    monkeypatch.setenv("MSTX_MARKS_EXCLUDE", "verl")
    with mark("after", domain="verl"):
        pass
    assert g.start is None and mstx_marks.current_backend().name == "record"
    assert PROCESS.recorder.records() == []


def test_what_presets_and_recipes_armed_is_kept(tmp_path: Path) -> None:
    PROCESS.presets["toy"] = object()
    PROCESS.captures.append("a capture")
    try:
        PROCESS.start_over()
        assert "toy" in PROCESS.presets and "a capture" in PROCESS.captures
    finally:
        del PROCESS.presets["toy"]
        PROCESS.captures.remove("a capture")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_keeps_its_settings_and_writes_its_own_files(tmp_path: Path) -> None:
    configure(include=["verl"])
    flush_at_exit(tmp_path)
    with mark("parent", domain="verl"):
        pass
    pid = os.fork()
    if pid == 0:  # the child: its own ranges only, in its own files, then a normal exit
        code = 1
        try:
            kept = PROCESS.settings.include == frozenset({"verl"})
            with mark("child", domain="verl"), mark("filtered", domain="other"):
                pass
            code = 0 if kept and PROCESS.session is not None else 3
        finally:
            import atexit

            atexit._run_exitfuncs()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    traces = {p.name: p for p in (tmp_path / "chrome").glob("*.trace.json")}
    child = [p for name, p in traces.items() if f"-{pid}." in name]
    assert len(child) == 1, sorted(traces)
    names = {e["name"] for e in json.loads(child[0].read_text())["traceEvents"] if e["ph"] == "X"}
    assert names == {"child"}  # not the parent's range, not the filtered one
