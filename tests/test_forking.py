"""What a forked child starts from (mstx_marks/base/forking.py), and what it costs to keep.

Every lock and fork reset is registered in one place; the registry holds nothing alive (issue 35
item 8: 200,000 recorders made and dropped kept +76 MB, with 202,000 locks and resets). In a
real ``os.fork`` child every live lock is made fresh before any reset runs, the resets of live
objects run in the order they were registered, and those of freed objects do not run.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading

from mstx_marks.backends.record import Recorder
from mstx_marks.base import forking

_MAKE_AND_DROP = textwrap.dedent(
    """
    import gc, resource
    from mstx_marks.backends.record import Recorder
    from mstx_marks.base import forking

    class Holder:  # any object with a lock and a reset of its own
        def __init__(self):
            self.lock = forking.new_lock()
            forking.after_fork_in_child(self.reset)

        def reset(self):
            self.lock = None

    def registered():
        return len(forking._locks) + len(forking._resets)

    for _ in range(2_000):  # warm the allocator and the code paths first
        Recorder(), Holder()
    gc.collect()
    peak, entries = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, registered()
    for _ in range(200_000):
        Recorder()
    for _ in range(200_000):
        Holder()
    gc.collect()
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    print(grown, registered() - entries)
    """
)


def test_dropped_recorders_and_objects_with_locks_are_freed() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    proc = subprocess.run(
        [sys.executable, "-c", _MAKE_AND_DROP],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    grown_kib, kept = (int(x) for x in proc.stdout.split())
    assert kept == 0  # no lock or reset of a dropped object stays registered
    assert grown_kib < 8 * 1024, f"peak RSS grew {grown_kib} KiB"  # was about 76 MiB


class _Owner:
    """An object with a lock and a fork reset that takes it."""

    def __init__(self, name: str, log: list[tuple[str, bool]]) -> None:
        self.name, self.log = name, log
        self.lock = forking.new_lock()
        forking.after_fork_in_child(self.reset)

    def reset(self) -> None:
        # Made fresh before any reset ran: free, though a thread of the parent held it.
        self.log.append((self.name, self.lock.acquire(timeout=2)))


def test_in_a_forked_child_live_objects_reset_in_order_and_freed_ones_are_gone() -> None:
    log: list[tuple[str, bool]] = []
    first, dropped, last = _Owner("first", log), _Owner("dropped", log), _Owner("last", log)
    rec = Recorder()
    rec.range_end(rec.range_start("parent_step", "d"), "d")
    for _ in range(1_000):  # made and dropped meanwhile: freed, never reset
        Recorder()
    del dropped
    gc.collect()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # holds both locks across the fork
        with first.lock, last.lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    report: dict[str, object] = {}
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the resets ran before this line
            try:
                report = {"log": log, "names": [x.name for x in rec.records()]}
                os.write(w, json.dumps(report).encode())
            finally:
                os._exit(0)
        os.close(w)
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        report = json.loads(data)
    finally:
        release.set()
        holder.join()
    assert report["log"] == [["first", True], ["last", True]]
    assert report["names"] == []  # the live recorder cleared itself: its parent's ranges
    assert [x.name for x in rec.records()] == ["parent_step"]  # the parent's are its own
    assert log == []  # resets run in children only


def test_a_bound_method_of_an_object_without_weak_references_is_kept() -> None:
    class Slotted:
        __slots__ = ("ran",)

        def __init__(self) -> None:
            self.ran = False

        def reset(self) -> None:
            self.ran = True

    obj = Slotted()
    before = len(forking._resets)
    forking.after_fork_in_child(obj.reset)
    assert len(forking._resets) == before + 1
    del obj
    gc.collect()
    assert len(forking._resets) == before + 1  # held as given, like a function
