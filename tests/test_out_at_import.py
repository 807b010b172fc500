"""``MSTX_MARKS_OUT`` alone, in a process that imports ``mstx_marks`` and nothing else (no
framework, no launcher): it records and writes there as a launched process does; unset, the
import stays light. And no temporary file of an interrupted write nests in another or trips a
reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.engine_run import clean_env

from mstx_marks.analysis.readers import find_trace_files
from mstx_marks.base.records import RangeRecord, RankTrace
from mstx_marks.export.files import atomic_paths, sweep_temps
from mstx_marks.export.process_files import export_rank
from mstx_marks.export.spill import read_spill

PLAIN = """
from mstx_marks import mark
for _ in range(3):
    with mark("train_step"):
        pass
"""


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=clean_env(**env), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_a_plain_program_writes_where_mstx_marks_out_says(tmp_path: Path) -> None:
    proc = _run(PLAIN, MSTX_MARKS_OUT=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (spill,) = (tmp_path / "spill").glob("*.jsonl")
    trace = read_spill(spill)
    assert (trace.role, [r.name for r in trace.records]) == ("main", ["train_step"] * 3)
    (chrome,) = (tmp_path / "chrome").glob("*.trace.json")
    assert chrome.name.startswith("main-rank0-")  # role, then rank
    assert list(tmp_path.glob("ascend/main_*_ascend_pt/ASCEND_PROFILER_OUTPUT/*.db"))
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]


def test_without_the_variable_nothing_is_written_and_nothing_more_imported() -> None:
    code = PLAIN + "import sys, json; print(json.dumps(sorted(sys.modules)))"
    plain = json.loads(_run(code).stdout)
    assert not [m for m in plain if m.startswith(("mstx_marks.export", "mstx_marks.launch"))]


def test_activation_at_import_is_idempotent_and_never_raises(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    code = PLAIN + (
        "import mstx_marks.launch.activate as a; a.activate_at_import(); a.activate()\n"
        "import mstx_marks.export.out as o; print(o._session is not None)"
    )
    ok = _run(code, MSTX_MARKS_OUT=str(tmp_path / "out"))
    assert ok.returncode == 0 and ok.stdout.strip() == "True", ok.stderr
    assert len(list((tmp_path / "out" / "spill").glob("*.jsonl"))) == 1  # one session
    bad = _run(PLAIN, MSTX_MARKS_OUT=str(blocked / "out"))  # cannot be created: still runs
    assert bad.returncode == 0 and "Traceback" not in bad.stderr, bad.stderr


def test_the_role_defaults_to_the_multiprocessing_name_then_the_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import multiprocessing as mp\n"
        "from mstx_marks.export.out import process_role\n"
        "def child(q): q.put(process_role())\n"
        "if __name__ == '__main__':\n"
        "    q = mp.get_context('spawn').Queue()\n"
        "    p = mp.get_context('spawn').Process(target=child, args=(q,), name='VllmWorker-1')\n"
        "    p.start(); print(process_role(), q.get()); p.join()\n"
    )
    proc = subprocess.run([sys.executable, str(script)], env=clean_env(), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.stdout.split() == ["train", "VllmWorker-1"], proc.stderr
    role = _run("from mstx_marks.export.out import process_role; print(process_role())",
                MSTX_MARKS_ROLE="rollout")  # fmt: skip
    assert role.stdout.strip() == "rollout"


def test_an_export_never_nests_temporary_names(tmp_path: Path, monkeypatch: object) -> None:
    """export_rank writes its two files into temporaries handed out together; the writers inside
    once wrapped those in temporaries of their own (``..rank0-...trace.json.<pid>...tmp.<pid>
    ...tmp``), left behind when the process was killed mid-export."""
    import mstx_marks.export.files as files

    seen: list[str] = []
    real = files.tempfile.mkstemp

    def spy(*args: object, **kw: object) -> tuple[int, str]:
        fd, name = real(*args, **kw)  # type: ignore[call-overload]
        seen.append(os.path.basename(name))
        return fd, name

    monkeypatch.setattr(files.tempfile, "mkstemp", spy)  # type: ignore[attr-defined]
    trace = RankTrace(0, [RangeRecord("step", "default", 1, 2, 1, 1)], role="WorkerDict")
    export_rank(tmp_path, trace, process="h-1")
    assert seen and all(name.count(".tmp") == 1 for name in seen), seen
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]


def test_leftovers_of_a_killed_writer_are_ignored_by_readers_and_swept(tmp_path: Path) -> None:
    dead = 2**22 + 7  # above any Linux pid_max: never alive
    export_rank(tmp_path, RankTrace(0, [RangeRecord("s", "default", 1, 2, 1, 1)]))
    chrome = tmp_path / "chrome"
    host = os.uname().nodename
    left = [
        chrome / f".rank0-h-1.trace.json.{dead}@{host}.abc.tmp",
        chrome / f"..rank0-h-1.trace.json.{dead}.x1.tmp.{dead}.y2.tmp",  # the old nested name
        chrome / f".ascend_pytorch_profiler_0.db.{dead}@{host}.q.tmp-journal",
        chrome / f".rank0-h-2.trace.json.{dead}@other-host.abc.tmp",  # another host's: kept
    ]
    for p in left:
        p.write_text("{half")
    assert all(
        p.parent.name != "chrome" or ".tmp" not in p.name for p in find_trace_files(tmp_path)
    )
    assert sweep_temps(chrome) == 0  # the reader swept them already (this host's dead writers)
    assert sorted(p.name for p in chrome.iterdir() if ".tmp" in p.name) == [left[3].name]
    with atomic_paths(chrome / "a.json") as (tmp,):  # a live writer's own file is kept
        tmp.write_text("{}")
        assert sweep_temps(chrome) == 0 and tmp.exists()
