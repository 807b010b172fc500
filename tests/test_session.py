"""One recording session per process: every request for files joins it (mstx_marks/export/out.py).

Each case runs the program as a user would, in its own interpreter, and reads back every file it
wrote: the spill, the Chrome traces and the databases.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from mstx_marks.export import read_ascend_db, read_chrome_trace
from mstx_marks.export.spill import read_spill


def _run(
    code: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**base, **(env or {})},
    )


def _names(folder: Path) -> dict[str, list[str]]:
    """Every file's range and instant names, by file kind and name."""
    out: dict[str, list[str]] = {}
    for p in sorted(folder.rglob("*.trace.json")):
        out[f"chrome {p.name}"] = [r.name for r in read_chrome_trace(p)[0].records]
    for p in sorted(folder.rglob("*.db")):
        out[f"db {p.parent.parent.name}"] = [r.name for r in read_ascend_db(p).records]
    for p in sorted((folder / "spill").glob("*.jsonl")) if (folder / "spill").is_dir() else ():
        out[f"spill {p.name}"] = [r.name for r in read_spill(p).records]
    return out


_BOTH = """
import sys
from mstx_marks import mark
from mstx_marks.export import flush_at_exit
flush_at_exit(sys.argv[1])  # README's own program, run with MSTX_MARKS_OUT set as well
site = mark("step")
for _ in range(int(sys.argv[2])):
    with site:
        pass
"""


def test_flush_at_exit_and_mstx_marks_out_together_keep_every_range(tmp_path: Path) -> None:
    n = 100_000
    proc = _run(
        _BOTH, str(tmp_path / "flush"), str(n), env={"MSTX_MARKS_OUT": str(tmp_path / "out")}
    )
    assert proc.returncode == 0, proc.stderr
    assert "fell behind" not in proc.stderr, proc.stderr  # one spill: nothing to fall behind
    spills = list(tmp_path.rglob("spill/*.jsonl"))
    assert len(spills) == 1  # one session: one spill, in the folder asked for first
    assert len(read_spill(spills[0]).records) == n
    # Both folders get the files, each a view of the one recording, each with every range.
    for folder in ("flush", "out"):
        files = {k: v for k, v in _names(tmp_path / folder).items() if not k.startswith("spill")}
        assert len(files) == 2, files
        assert all(len(v) == n for v in files.values()), {k: len(v) for k, v in files.items()}


_FROM_A_THREAD = """
import sys, threading
from mstx_marks import mark
from mstx_marks.export import flush_at_exit
t = threading.Thread(target=flush_at_exit, args=(sys.argv[1],))
t.start(); t.join()
for _ in range(5):
    with mark("step"):
        pass
"""


def test_flush_at_exit_from_a_thread_says_what_it_cannot_hook_and_writes_at_exit(
    tmp_path: Path,
) -> None:
    proc = _run(_FROM_A_THREAD, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "signal only works" not in proc.stderr
    assert proc.stderr.count("other than the main one") == 1
    names = _names(tmp_path)
    assert len([k for k in names if k.startswith("spill")]) == 1
    assert all(v == ["step"] * 5 for v in names.values()), names


_LATE_HOOK = """
import atexit, sys
def final():
    from mstx_marks import instant, mark
    with mark("final_range"):
        instant("final_instant")
atexit.register(final)  # registered before the library is imported: runs after its exit write
from mstx_marks import mark
from mstx_marks.export import flush_at_exit
flush_at_exit(sys.argv[1])
for _ in range(3):
    with mark("step"):
        pass
"""


def test_an_exit_hook_registered_before_the_import_keeps_its_ranges(tmp_path: Path) -> None:
    proc = _run(_LATE_HOOK, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    names = _names(tmp_path)
    assert len(names) == 3, names  # the Chrome trace, the database and the spill
    for kind, found in names.items():
        assert sorted(found) == sorted(["step"] * 3 + ["final_range", "final_instant"]), kind


_ENDED_THREAD = """
import sys, threading
from mstx_marks import mark
from mstx_marks.export import flush_at_exit
flush_at_exit(sys.argv[1])
def rollout():
    with mark("generate_sequences"):
        pass
t = threading.Thread(target=rollout, name="rollout-0")
t.start(); t.join()  # ended long before the files are written
with mark("step"):
    pass
"""


def test_a_thread_that_ended_before_the_write_keeps_its_name(tmp_path: Path) -> None:
    import json

    proc = _run(_ENDED_THREAD, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (chrome,) = tmp_path.rglob("*.trace.json")
    events = json.loads(chrome.read_text())["traceEvents"]
    named = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    (gen,) = [e for e in events if e.get("name") == "generate_sequences" and e.get("ph") == "X"]
    assert named[gen["tid"]] == "rollout-0"
