"""``mstx-marks export``: the Chrome trace and database of a process that left only its spill
(a Ray worker SIGKILLed after its SIGTERM writes its spill and nothing else), named as the process
would have named them, read back with what the spill holds; a second run has nothing to do."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

from mstx_marks.cli.main import main
from mstx_marks.export.ascend_db import read_ascend_db
from mstx_marks.export.chrome import read_chrome_trace
from mstx_marks.export.from_spills import export_spills, unexported
from mstx_marks.export.spill import read_spill

# A worker as Ray ends it: its last stage done, its final spill written (what out.py does on a
# Ray worker's SIGTERM), then SIGKILL before any export.
WORKER = """
import os, signal
from mstx_marks.launch.activate import activate
activate()
from mstx_marks import mark
from mstx_marks.core.process import PROCESS
for step in range(3):
    with mark("update_actor", args={"step": step}):
        pass
with mark("left_open"):
    PROCESS.session.spill_only = True
    PROCESS.session.write_now(final=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_worker(out: Path, role: str) -> int:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WORKER)],
        env=dict(os.environ, MSTX_MARKS_OUT=str(out), MSTX_MARKS_ROLE=role),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return int(_pid_of(out, role))


def _pid_of(out: Path, role: str) -> str:
    for spill in (out / "spill").glob("*.jsonl"):
        if read_spill(spill).role == role:
            return spill.stem.rsplit("-", 1)[1]
    raise AssertionError(f"no spill of {role} in {out}")


def _names(records: object) -> Counter[str]:
    return Counter(r.name for r in records)  # type: ignore[attr-defined]


def test_a_killed_workers_spill_becomes_its_trace_and_database(tmp_path: Path) -> None:
    pid = _killed_worker(tmp_path, "FSDPWorker")
    assert not (tmp_path / "chrome").exists() and not (tmp_path / "ascend").exists()
    (spill,) = unexported(tmp_path)
    assert spill.name == f"{socket.gethostname()}-{pid}.jsonl"

    written = export_spills(tmp_path)
    chrome, db = written
    assert chrome.name == f"FSDPWorker-rank0-{socket.gethostname()}-{pid}.trace.json"
    assert db.parent.parent.name.startswith(f"FSDPWorker_{socket.gethostname()}_{pid}_")
    want = _names(read_spill(spill).records)
    assert want == {"update_actor": 3, "left_open": 1}
    (trace,) = read_chrome_trace(chrome)
    assert _names(trace.records) == want and trace.role == "FSDPWorker"
    assert _names(read_ascend_db(db).records) == want
    assert unexported(tmp_path) == [] and export_spills(tmp_path) == []


def test_a_process_that_wrote_its_exports_keeps_them_unless_all_are_asked(
    tmp_path: Path,
) -> None:
    _killed_worker(tmp_path, "Rollout")
    chrome, db = export_spills(tmp_path)
    (spill,) = (tmp_path / "spill").glob("*.jsonl")
    os.utime(spill, ns=(time.time_ns(), time.time_ns() + 10**9))  # a late line of its exit
    assert unexported(tmp_path) == [] and export_spills(tmp_path) == []
    assert export_spills(tmp_path, every=True) == [chrome, db]  # the same files, replaced
    assert len(list((tmp_path / "ascend").iterdir())) == 1


def test_processes_on_hosts_whose_names_end_alike_are_kept_apart(tmp_path: Path) -> None:
    pid = _killed_worker(tmp_path, "Trainer")
    (spill,) = (tmp_path / "spill").glob("*.jsonl")
    host = socket.gethostname()
    other = spill.with_name(f"x-{host}-{pid}.jsonl")  # another host, "x-<host>", same pid
    other.write_bytes(spill.read_bytes())
    export_spills(tmp_path)
    names = sorted(p.name for p in (tmp_path / "chrome").iterdir())
    assert names == sorted(
        [f"Trainer-rank0-{host}-{pid}.trace.json", f"Trainer-rank0-x-{host}-{pid}.trace.json"]
    )
    assert unexported(tmp_path) == []


def test_the_command_says_how_many_it_exported(tmp_path: Path, capsys: object) -> None:
    _killed_worker(tmp_path, "Reward")
    assert main(["export", str(tmp_path)]) == 0
    out, err = capsys.readouterr()  # type: ignore[attr-defined]
    assert len(out.splitlines()) == 2 and "1 process exported (1 had only a spill)" in err
    assert main(["export", str(tmp_path)]) == 0
    out, err = capsys.readouterr()  # type: ignore[attr-defined]
    assert out == "" and "0 processes exported (0 had" in err
    assert main(["export", str(tmp_path / "nowhere")]) == 2


def test_the_summary_says_which_command_writes_the_missing_files(
    tmp_path: Path, capsys: object
) -> None:
    _killed_worker(tmp_path, "Reward")
    assert main(["summary", str(tmp_path)]) == 0
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "1 process left only a spill" in err and f"mstx-marks export {tmp_path}" in err
    main(["export", str(tmp_path)])
    capsys.readouterr()  # type: ignore[attr-defined]
    assert main(["summary", str(tmp_path)]) == 0
    assert "left only a spill" not in capsys.readouterr().err  # type: ignore[attr-defined]


# A Ray worker with a recipe's capture window: its profiler's trace holds the window's
# record_function ranges; the worker is then ended as Ray ends it (only its spill written).
CAPTURED = """
import os, signal, torch
from mstx_marks.launch.activate import activate
activate()
from mstx_marks import mark
from mstx_marks.core.process import PROCESS
for step in range(5):
    with mark("step"):
        torch.ones(8) @ torch.ones(8)
with torch.profiler.profile() as prof:
    with mark("step"), torch.profiler.record_function("step"):
        torch.ones(8) @ torch.ones(8)
os.makedirs(os.environ["CAPTURE"], exist_ok=True)
prof.export_chrome_trace(os.path.join(os.environ["CAPTURE"], "window.pt.trace.json"))
PROCESS.session.spill_only = True
PROCESS.session.write_now(final=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_capture_window_of_a_process_never_stands_for_its_recording(
    tmp_path: Path, capsys: object
) -> None:
    """The profiler's trace of one window (torch's, or torch_npu's database) holds the same
    process as our files: the summary uses ours, which hold the whole run."""
    import json

    capture = tmp_path / "update_micro_batch"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CAPTURED)],
        env=dict(os.environ, MSTX_MARKS_OUT=str(tmp_path), CAPTURE=str(capture)),
        timeout=120, capture_output=True, check=False,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert list(capture.glob("*.pt.trace.json"))
    assert main(["summary", str(tmp_path), "--json"]) == 0
    phases = json.loads(capsys.readouterr().out)["phases"]  # type: ignore[attr-defined]
    assert {p["name"]: p["all"]["count"] for p in phases}.get("step") == 6
