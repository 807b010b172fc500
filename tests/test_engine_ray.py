"""The real Ray 2.60 on CPU: actors activated through ``runtime_env`` alone, ended by a plain
``ray.shutdown()``.

Ray ends its workers from C++ (seen with strace): on ``ray.shutdown()`` the raylet sends SIGTERM
and SIGKILLs the worker some 20-60 ms later, or the worker's own C++ thread calls ``_exit``;
``ray.kill()`` calls ``_exit`` in C++. No atexit hook and no ``os._exit`` runs, and the Python
signal handlers mostly do not either (the main thread sits in the core worker's task loop, and
the SIGTERM lands on any thread). What an actor recorded reaches the disk through the spill:
every 0.5 s from a thread, and on the SIGTERM from a thread woken by ``signal.set_wakeup_fd``
(``mstx_marks.export.out._SignalWatch``) if it runs before the SIGKILL (18 of 20 actors in one
measurement, 13 of 20 without it). So the Ray scenarios wait 1.5 s before ``ray.shutdown()``
(what is guaranteed: at most the last interval is lost), and the SIGTERM path is tested without
Ray, where it is deterministic (last test).

Scenarios (``tests/engines/ray_actors.py``, in the rl venv):

- ``hook``: ``worker_process_setup_hook="mstx_marks.activate"`` and
  ``MSTX_MARKS_OUT`` in ``env_vars``; two marked actors (RANK 0 and 1), one idle actor.
- ``env``: ``MSTX_MARKS_OUT`` in ``env_vars`` only, no setup hook, no framework: ``import
  mstx_marks`` in each actor activates; two actor classes on one rank, told apart by role.
- ``verl``: the documented verl form, ``env_vars`` only, no setup hook: ``import verl`` in an
  actor loads verl's ``verl.plugins`` entry point, which activates.
"""

from __future__ import annotations

import contextlib
import json
import platform
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.engine_run import (
    clean_env,
    counts,
    files_by_pid,
    read_json,
    scenario,
    spills,
    venv_python,
)

from mstx_marks.export.spill import read_spill

RAY_TIMEOUT_S = 240
N1, N2 = 5, 7
VERL_CALLS = 3
STAGE = "actor_stage"  # tests/engines/ray_actors.py
SPILLED = 1.5  # seconds the driver waits before ray.shutdown(): over twice the spill interval


@dataclass
class Run:
    result: dict[str, Any]
    out: Path


@pytest.fixture(scope="module")
def rl_python() -> Path:
    return venv_python("rl")


def _run(python: Path, where: Path, *args: object) -> Run:
    out, result = where / "out", where / "result.json"
    scenario(
        python, "ray_actors.py", [args[0], out, *args[1:], result],
        clean_env(RAY_USAGE_STATS_ENABLED="0"),
        timeout=RAY_TIMEOUT_S, cwd=where,
    ).run()  # fmt: skip
    return Run(read_json(result), out)


@pytest.fixture(scope="module")
def hook_run(rl_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _run(rl_python, tmp_path_factory.mktemp("ray-hook"), "hook", N1, N2, SPILLED)


@pytest.fixture(scope="module")
def env_run(rl_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _run(rl_python, tmp_path_factory.mktemp("ray-env"), "env", N1, N2, SPILLED)


@pytest.fixture(scope="module")
def verl_run(rl_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _run(rl_python, tmp_path_factory.mktemp("ray-verl"), "verl", VERL_CALLS)


# --- worker_process_setup_hook ------------------------------------------------------------------


def test_each_actor_leaves_its_own_ranges_after_a_plain_shutdown(hook_run: Run) -> None:
    marked = hook_run.result["marked"]
    pids = [m["pid"] for m in marked]
    assert len(set(pids)) == 2 and hook_run.result["driver_pid"] not in pids
    traces = spills(hook_run.out)
    assert set(traces) == set(pids)
    for actor, wanted in zip(marked, (N1, N2)):
        trace = traces[actor["pid"]]
        assert counts(trace.ranges) == {STAGE: wanted}
        assert {r.domain for r in trace.ranges} == {"ray_test"}
        assert trace.rank == int(actor["rank"])  # RANK from the actor's own runtime_env
        assert not any(r.open for r in trace.ranges)


def test_an_idle_worker_activates_but_writes_nothing(hook_run: Run) -> None:
    idle = hook_run.result["idle"]
    assert idle["activated_in"] == idle["pid"]  # the setup hook ran in that worker too
    marked = [m["pid"] for m in hook_run.result["marked"]]
    everyone = [*marked, idle["pid"], hook_run.result["driver_pid"]]
    files = files_by_pid(hook_run.out, everyone)
    # Only the two marked actors wrote, each its own file(s): nothing of the idle actor, of the
    # driver, or of any other Ray worker process (under None).
    assert set(files) == set(marked), {k: [p.name for p in v] for k, v in files.items()}
    for pid in marked:
        (spill,) = (p for p in files[pid] if p.suffix == ".jsonl")
        assert read_spill(spill).records[0].pid == pid


def test_summary_reads_the_actors_spills(hook_run: Run, rl_python: Path) -> None:
    shown = subprocess.run(
        [str(rl_python), "-m", "mstx_marks", "summary", str(hook_run.out), "--json"],
        env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    (stage,) = (p for p in json.loads(shown.stdout)["phases"] if p["name"] == STAGE)
    assert stage["all"]["count"] == N1 + N2
    assert {r: s["count"] for r, s in stage["ranks"].items()} == {"0": N1, "1": N2}
    assert stage["role"] == "Marked"  # one role (the actor class), two ranks


def _exported_copy(run: Run, rl_python: Path, tmp_path: Path) -> Path:
    """A copy of ``run``'s folder after ``mstx-marks export`` (in the rl venv)."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(run.out, out)
    done = subprocess.run(
        [str(rl_python), "-m", "mstx_marks", "export", str(out)],
        env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def test_export_writes_each_actors_trace_and_database_from_its_spill(
    hook_run: Run, rl_python: Path, tmp_path: Path
) -> None:
    """Ray's SIGKILL leaves the actors' spills, mostly without exports: ``mstx-marks export``
    writes them, named by each actor's role, rank, host and pid, with what the spill holds."""
    from mstx_marks.export.ascend_db import read_ascend_db
    from mstx_marks.export.chrome import read_chrome_trace

    out = _exported_copy(hook_run, rl_python, tmp_path)
    traces = spills(out)
    for actor, wanted in zip(hook_run.result["marked"], (N1, N2)):
        pid, rank = actor["pid"], int(actor["rank"])
        (chrome,) = (out / "chrome").glob(f"Marked-rank{rank}-*-{pid}.trace.json")
        (db,) = (out / "ascend").glob(f"Marked_*_{pid}_*_ascend_pt/*/*.db")
        for trace in (*read_chrome_trace(chrome), read_ascend_db(db)):
            assert counts(trace.records) == counts(traces[pid].records)
            assert counts(trace.ranges) == {STAGE: wanted}
    again = subprocess.run(
        [str(rl_python), "-m", "mstx_marks", "export", str(out)],
        env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.stdout == "", again.stdout


def test_each_actor_measured_its_clock_against_the_clock_actor(
    hook_run: Run, rl_python: Path, tmp_path: Path
) -> None:
    """Round trips to the Ray clock actor reach each actor's files (the exported Chrome trace a
    user opens); on this one machine, where the true offset is 0, each bounds it: the actor's
    reading, on the machine's monotonic clock, lies between the worker's two readings."""
    from mstx_marks.base.records import RoundTrip
    from mstx_marks.export.chrome import read_chrome_trace

    assert hook_run.result["round_trips_after_s"] is not None, "no round trip within 90 s"
    out = _exported_copy(hook_run, rl_python, tmp_path)
    for actor in hook_run.result["marked"]:
        pid, rank = actor["pid"], int(actor["rank"])
        (chrome,) = (out / "chrome").glob(f"Marked-rank{rank}-*-{pid}.trace.json")
        (trace,) = read_chrome_trace(chrome)
        trips = [RoundTrip.of(r.name, r.domain, r.args) for r in trace.instants]
        trips = [t for t in trips if t is not None]
        assert trips and trace.anchor_ns is not None and trace.boot_id
        for t in trips:
            assert (t.peer_host, t.peer_boot_id) == (trace.host, trace.boot_id)
            peer_mono = t.peer_ns - t.peer_anchor_ns
            assert t.sent_ns - trace.anchor_ns <= peer_mono <= t.received_ns - trace.anchor_ns
            assert t.received_ns - t.sent_ns < 10**9  # (a call to a local actor: well under 1 s)
    # the idle actor and the clock actor itself recorded nothing, so wrote nothing
    idle = hook_run.result["idle"]["pid"]
    assert not list(hook_run.out.glob(f"spill/*-{idle}*.jsonl"))
    assert len(list(hook_run.out.glob("spill/*.jsonl"))) == 2


# --- MSTX_MARKS_OUT in env_vars only: `import mstx_marks` activates, roles tell actors apart --


def test_env_vars_alone_record_in_actors_that_import_mstx_marks(env_run: Run) -> None:
    marked = env_run.result["marked"]
    assert [m["role"] for m in marked] == ["Trainer", "Rollout"]  # the actors' classes
    assert all(m["activated_in"] == m["pid"] for m in marked)  # at import, in the actor
    traces = spills(env_run.out)
    assert set(traces) == {m["pid"] for m in marked}
    for actor, wanted in zip(marked, (N1, N2)):
        trace = traces[actor["pid"]]
        assert counts(trace.ranges) == {STAGE: wanted}
        assert (trace.role, trace.rank) == (actor["role"], 0)
    assert not [p for p in env_run.out.rglob("*") if ".tmp" in p.name]


def test_summary_keeps_two_roles_of_one_rank_apart(env_run: Run, rl_python: Path) -> None:
    shown = subprocess.run(
        [str(rl_python), "-m", "mstx_marks", "summary", str(env_run.out), "--json"],
        env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert set(doc["ranks"]) == {"Rollout:0", "Trainer:0"}
    stages = {p["role"]: p["ranks"]["0"]["count"] for p in doc["phases"] if p["name"] == STAGE}
    assert stages == {"Trainer": N1, "Rollout": N2}


# --- the documented verl form: env_vars only, verl's plugin entry point activates ---------------


def test_import_verl_in_an_actor_activates_and_arms_the_preset(verl_run: Run) -> None:
    probe = verl_run.result["probe"]
    assert probe["mstx_marks_before_import_verl"] == []  # nothing but the entry point loaded it
    assert probe["plugin_loaded_by_import_verl"]
    assert probe["activated_in"] == probe["pid"]
    worker = "verl.workers.engine_workers:ActorRolloutRefWorker"
    wanted = {f"{worker}.{m}" for m in ("compute_log_prob", "compute_ref_log_prob", "update_actor")}
    assert wanted <= set(probe["patched"])
    assert probe["register_attr_kept"]


def test_the_patched_stage_records_in_the_actor(verl_run: Run) -> None:
    probe = verl_run.result["probe"]
    traces = spills(verl_run.out)
    assert set(traces) == {probe["pid"]}
    assert counts(traces[probe["pid"]].ranges) == {"compute_log_prob": VERL_CALLS}


# --- the exit Ray gives its workers, without Ray: SIGTERM while the main thread is in C ---------

STUCK_IN_C = """
import ctypes, signal, sys
from mstx_marks import mark
from mstx_marks.export.out import record_to

record_to(sys.argv[1], interval=None)  # no periodic spill: only an exit path can write
for _ in range(3):
    with mark("last_step"):
        pass
# As in a Ray worker: the main thread never runs Python again (it sits in C), and the SIGTERM
# goes to another thread; so no Python signal handler and no atexit hook ever runs.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print("ready", flush=True)
ctypes.CDLL(None).sleep(120)
"""


#: The sleep syscalls libc's sleep() makes (nanosleep, clock_nanosleep), by machine.
_SLEEPS = {"x86_64": {"35", "230"}, "aarch64": {"101", "115"}}


def _wait_until_sleeping_in_c(pid: int) -> None:
    """Until the main thread is inside libc's sleep: a SIGTERM that arrived while it still ran
    Python (after printing "ready", on a loaded machine) would run the Python handler there, and
    the exit hooks with it, which is not the case under test."""
    sleeps = _SLEEPS.get(platform.machine())
    deadline = time.monotonic() + 10
    while sleeps is not None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/syscall").read_text().split()[0] in sleeps:
                return
        time.sleep(0.01)
    time.sleep(0.5)  # no way to see it here: give it time


def test_sigterm_spills_even_when_no_python_handler_can_run(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(STUCK_IN_C), str(tmp_path)],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    spill = tmp_path / "spill"
    found: list[str] = []
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert not spill.exists()
        _wait_until_sleeping_in_c(proc.pid)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(found) < 3:
            time.sleep(0.01)
            for path in spill.glob("*.jsonl"):
                found = [r.name for r in read_spill(path).records]
    finally:
        proc.kill()  # SIGKILL, as the raylet does
        proc.wait(timeout=30)
    assert found == ["last_step"] * 3
    (path,) = spill.glob("*.jsonl")
    assert read_spill(path).records[0].pid == proc.pid
    assert not (tmp_path / "chrome").exists()  # indeed no exit hook ran
