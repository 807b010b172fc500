"""MSTX_MARKS_OFF=1 at import: the hard off switch (mstx_marks/off.py). Each test runs a fresh
interpreter, since the switch is read once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_PROGRAM = textwrap.dedent(
    """
    import json, sys
    import mstx_marks
    from mstx_marks import configure, default_recorder, instant, mark, mstx_range
    from mstx_marks.capture.instrument import instrument
    from mstx_marks.core.off import NOOP_MARK

    def f(x):
        return x + 1

    deco = mstx_range("update_actor", domain="verl")(f)
    bare = mstx_range(f)
    m1, m2 = mark("step"), mark("other", domain="verl", stream="current")
    timing = {}
    with mark("gen", timing=timing):
        with m1:
            instant("tick")
    configure(backend="record", enabled=True)  # cannot switch it on: warns once
    with mark("after_configure"):
        pass

    class Engine:
        def step(self):
            return 2

    handle = instrument(Engine, "step")
    print(json.dumps({
        "same_function": deco is f and bare is f,
        "shared_noop": m1 is NOOP_MARK and m2 is NOOP_MARK,
        "timing": sorted(timing),
        "recorded": len(default_recorder().records()),
        "patched": list(handle.patched),
        "skipped": [reason for _, reason in handle.skipped],
        "active": mstx_marks.is_active(),
    }))
    """
)


def _run(env_value: str | None) -> tuple[dict[str, object], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    if env_value is not None:
        env["MSTX_MARKS_OFF"] = env_value
    proc = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", _PROGRAM],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("value", ["1", "on", "TRUE"])
def test_the_off_switch_leaves_functions_as_they_are_and_records_nothing(value: str) -> None:
    got, stderr = _run(value)
    assert got["same_function"] is True and got["shared_noop"] is True
    assert got["timing"] == ["gen"]  # verl reads timing_raw: it is still filled
    assert got["recorded"] == 0 and got["active"] is False
    assert got["patched"] == [] and got["skipped"] == ["MSTX_MARKS_OFF"]
    assert stderr.count("MSTX_MARKS_OFF=1 was set") == 1  # configure(enabled=True) said so


def test_without_the_switch_the_same_program_records() -> None:
    got, _ = _run(None)
    assert got["same_function"] is False and got["shared_noop"] is False
    assert got["recorded"] == 1 and got["patched"] == ["__main__:Engine.step"]


def test_the_off_switch_says_once_what_it_ignores(tmp_path: object) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    env |= {"MSTX_MARKS_OFF": "1", "MSTX_MARKS_OUT": str(tmp_path), "MSTX_MARKS_INSTRUMENT": "vllm"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import mstx_marks.launch.activate as a; a.activate(); a.activate()",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("MSTX_MARKS_OUT, MSTX_MARKS_INSTRUMENT ignored") == 1, proc.stderr
