"""Issue 35, proved the way it failed: real programs (tests/support/crash_program.py) run as
users run them, real signals sent from another process, and only what a user reads checked
afterwards: the Chrome trace, the Ascend database (``MSTX_EVENTS`` + ``STRING_IDS``) and
``python -m mstx_marks summary --json`` / ``export`` of the folder, never the recorder's memory.

1. kill stress: a program whose own SIGTERM / SIGINT handlers record, killed at random moments,
   two at a time: every process exits within 10 s, every range completed before the signal is in
   its files (``MSTX_CRASH_KILLS``, default 12, six pairs; the time for 200 at that rate is
   printed);
2. new names past the name cap in one write (their table past a line's bound; the issue's
   300,000): every event in every file, past the cap under the placeholder name;
3. interrupted starts: recursion-limit sweeps through ranges first used near the limit; a SIGALRM
   handler that raises 1,500 times (three runs of 500); 1,500 Ctrl-Cs from another process (two
   storms of 750); then every later range is recorded and no duration is absurd;
4. ``flush_at_exit("out")`` under ``MSTX_MARKS_OUT``, past twice the recorder's capacity;
5. a tight loop past the capacity: nothing dropped;
6. a long run, many times the recorder's capacity and past its names, through both views, in
   memory that does not grow with the run's length (the issue's 3 million events and 200,000
   names, with their peak: ``python3 benchmarks/long_run.py --check``).

Every process has a time limit: a hang is a failure that names where it hung (the program dumps
its threads' stacks on SIGUSR1).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from mstx_marks.export.spill import MAX_LINE

PROGRAM = Path(__file__).parent / "support" / "crash_program.py"
PLACEHOLDER = "(other names)"  # docs/reference/environment.md, MSTX_MARKS_RECORD_NAMES
CHROME = "chrome/*.trace.json"
DATABASE = "ascend/*/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_*.db"

#: How many processes the kill stress kills (two at a time; each about 1.5 s on 2 CPUs); 200 is
#: the issue's count.
KILLS = int(os.environ.get("MSTX_CRASH_KILLS", "12"))
#: How many of the killed processes also get ``summary --json`` (the cheap ones: few names).
KILL_SUMMARIES = int(os.environ.get("MSTX_CRASH_KILL_SUMMARIES", "3"))

_SETTINGS = settings(
    deadline=None,
    database=None,
    phases=(Phase.generate,),  # shrinking a run of real processes only repeats it
    suppress_health_check=list(HealthCheck),
)


# --- running a program as a user does --------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    base.pop("RANK", None)
    return {**base, **extra}


def _command(*args: object) -> list[str]:
    return [sys.executable, str(PROGRAM), *(str(a) for a in args)]


def _run(*args: object, env: dict[str, str], cwd: Path, timeout: float = 300) -> Run:
    """Run the program to its end; a program still running at ``timeout`` fails, with stacks."""
    started = time.monotonic()
    proc = subprocess.Popen(
        _command(*args), env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = _stacks_then_kill(proc)
        pytest.fail(f"{args} still running after {timeout} s; stacks:\n{err.decode()[-6000:]}")
    run = Run(proc.returncode, out.decode(), err.decode(), time.monotonic() - started)
    assert run.rc == 0, f"{args}: exit {run.rc}\n{run.err[-4000:]}"
    assert "done" in run.lines, f"{args}: the program did not finish\n{run.err[-4000:]}"
    return run


def _stacks_then_kill(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """Ask the hung program for its threads' stacks (faulthandler, SIGUSR1), then SIGKILL it."""
    try:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
    finally:
        proc.kill()
    return proc.communicate()


@dataclass
class Run:
    rc: int
    out: str
    err: str
    seconds: float

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()

    def value(self, key: str) -> int:
        """The number the program printed after ``key``."""
        found = [line.split()[1] for line in self.lines if line.startswith(key + " ")]
        assert found, f"the program printed no {key!r}: {self.out[-2000:]}"
        return int(float(found[-1]))


# --- reading what a user reads ---------------------------------------------------------------


@dataclass
class Events:
    """The ranges of one file: how many of each name, and each thread's durations (ns)."""

    names: Counter[str] = field(default_factory=Counter)
    durations: dict[Any, list[int]] = field(default_factory=lambda: defaultdict(list))
    starts: dict[Any, list[tuple[int, str]]] = field(default_factory=lambda: defaultdict(list))
    dropped: int = 0
    open: int = 0  # ranges the file flags as never ended (Chrome: args.open)
    open_ranges: list[tuple[str, float]] = field(default_factory=list)  # the first: name, ms
    #: (duration in ns, name) of every range flagged open (Chrome), to leave out of both files'
    #: sums (the files' starts are on different origins; a duration is the same in both)
    open_starts: set[tuple[int, str]] = field(default_factory=set)

    @property
    def total(self) -> int:
        return sum(self.names.values())


def _chrome_objects(path: Path) -> tuple[Iterator[dict[str, Any]], Callable[[], dict[str, Any]]]:
    """The trace's events, parsed one by one in bounded memory, and (once they are read) the
    rest of the file's object. The whole file is checked to be JSON: a torn file fails."""
    decoder = json.JSONDecoder()
    rest: dict[str, Any] = {}

    def events() -> Iterator[dict[str, Any]]:
        if path.stat().st_size < 64 << 20:  # small: parsed whole, faster
            whole = json.loads(path.read_text(encoding="utf-8"))
            yield from whole["traceEvents"]
            rest.update({k: v for k, v in whole.items() if k != "traceEvents"})
            return
        with path.open(encoding="utf-8") as f:
            buf, pos, eof = f.read(1 << 20), 0, False
            head = re.match(r'\s*\{\s*"traceEvents"\s*:\s*\[', buf)
            if head is None:  # not ours: read it whole
                whole = json.loads(buf + f.read())
                yield from whole["traceEvents"]
                rest.update({k: v for k, v in whole.items() if k != "traceEvents"})
                return
            pos = head.end()
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n,":
                    pos += 1
                if pos >= len(buf) - 65536 and not eof:
                    more = f.read(1 << 20)
                    eof = not more
                    buf, pos = buf[pos:] + more, 0
                    continue
                if pos < len(buf) and buf[pos] == "]":
                    tail = buf[pos + 1 :] + f.read()
                    rest.update(json.loads("{" + tail.lstrip().removeprefix(",")))
                    return
                try:
                    obj, pos = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as exc:
                    if eof:
                        raise AssertionError(f"{path}: not a whole JSON trace: {exc}") from None
                    more = f.read(1 << 20)
                    eof = not more
                    buf, pos = buf[pos:] + more, 0
                    continue
                yield obj

    return events(), lambda: rest


def read_chrome(path: Path, *, detail: bool = True) -> Events:
    """The trace's complete ranges ("X" events); with ``detail``, each thread's too."""
    got = Events()
    events, rest = _chrome_objects(path)
    for e in events:
        if e.get("ph") != "X":
            continue
        name, tid = e["name"], e.get("tid")
        got.names[name] += 1
        if (e.get("args") or {}).get("open"):
            got.open += 1
            got.open_starts.add((round(float(e["dur"]) * 1000), name))
            if len(got.open_ranges) < 5:
                got.open_ranges.append((name, round(float(e["dur"]) / 1000, 1)))
        if detail:
            got.durations[tid].append(round(float(e["dur"]) * 1000))
            got.starts[tid].append((round(float(e["ts"]) * 1000), name))
    for info in rest().get("otherData", {}).get("ranks", {}).values():
        got.dropped += int(info.get("dropped", 0))
    return got


def read_database(path: Path, *, detail: bool = True) -> Events:
    """MSTX_EVENTS joined to STRING_IDS, as msprof-analyze and MindStudio Insight read them."""
    got = Events()
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        ranges = "e.eventType = (SELECT id FROM ENUM_MSTX_EVENT_TYPE WHERE name = 'start/end')"
        for name, count in db.execute(
            "SELECT s.value, COUNT(*) FROM MSTX_EVENTS e LEFT JOIN STRING_IDS s"
            f" ON e.message = s.id WHERE {ranges} GROUP BY s.value"
        ):
            got.names[name if name is not None else "<no STRING_IDS row>"] += count
        if detail:
            for name, tid, start, end in db.execute(
                "SELECT s.value, e.globalTid, e.startNs, e.endNs FROM MSTX_EVENTS e"
                f" LEFT JOIN STRING_IDS s ON e.message = s.id WHERE {ranges}"
            ):
                got.durations[tid].append(end - start)
                got.starts[tid].append((start, name))
        row = db.execute("SELECT value FROM META_DATA WHERE name = 'mstx_marks_dropped'").fetchone()
        got.dropped = int(json.loads(row[0])) if row else 0
    finally:
        db.close()
    return got


def summary(folder: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "mstx_marks", "summary", "--json", "--no-per-step", "--jobs", "1",
         str(folder)],
        capture_output=True, text=True, timeout=300, env=_env(),
    )  # fmt: skip
    assert proc.returncode == 0, f"summary --json {folder}: exit {proc.returncode}\n{proc.stderr}"
    got: dict[str, Any] = json.loads(proc.stdout)
    return got


def summary_counts(got: dict[str, Any]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for phase in got["phases"]:
        counts[phase["name"]] += phase["all"]["count"]
    return counts


def summary_losses(got: dict[str, Any]) -> list[str]:
    return [n for n in got.get("notes", []) if "dropped" in n or "skipped" in n]


def export(folder: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "mstx_marks", "export", str(folder)],
        capture_output=True, text=True, timeout=300, env=_env(),
    )  # fmt: skip
    assert proc.returncode == 0, f"export {folder}: exit {proc.returncode}\n{proc.stderr}"
    return proc.stdout + proc.stderr


@dataclass
class Files:
    folder: Path
    chrome: Events
    database: Events
    exported_later: bool


def _listing(folder: Path) -> list[str]:
    if not folder.exists():
        return ["(no folder)"]
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def files_of(folder: Path, stderr: str, *, export_allowed: bool, detail: bool = True) -> Files:
    """The one Chrome trace and the one database of a process's folder. Written at exit; where
    ``export_allowed``, a spill and one line saying so are enough, and ``export`` writes them."""
    chromes, dbs = sorted(folder.glob(CHROME)), sorted(folder.glob(DATABASE))
    exported = False
    # The exit ran out of its budget for this folder: it kept the files of an earlier write
    # (a signal's flush) and said so, naming the folder; the user exports, as told.
    told = export_allowed and f"mstx-marks export {folder}`" in stderr
    if told or not (chromes and dbs):
        missing = f"{folder}: no Chrome trace or no database at exit; files {_listing(folder)}"
        assert export_allowed, f"{missing}\nstderr: {stderr[-3000:]}"
        assert "export" in stderr, f"{missing}, and no line says to export\n{stderr[-3000:]}"
        export(folder)
        chromes, dbs, exported = sorted(folder.glob(CHROME)), sorted(folder.glob(DATABASE)), True
    assert len(chromes) == 1 and len(dbs) == 1, f"{folder}: {_listing(folder)}"
    return Files(
        folder,
        read_chrome(chromes[0], detail=detail),
        read_database(dbs[0], detail=detail),
        exported,
    )


def absurd_durations(
    events: Events, wall_ns: int, open_starts: set[tuple[int, str]] | None = None
) -> list[str]:
    """Threads whose (non-nested) ranges add up to more than the run's wall time. A range the
    Chrome trace flags open (``open_starts``: its start and name) is left out: a range whose exit
    a Ctrl-C cut short at its first instruction, and that was not entered again, cannot be told
    from one still running, and ends (flagged) at the exit; a few a thread may be so (the last
    at each site, and one a second interruption cut short inside the clean-up)."""
    said = []
    open_starts = events.open_starts if open_starts is None else open_starts
    for tid, all_durs in events.durations.items():
        starts = events.starts.get(tid, [])
        kept = (
            [
                d
                for d, (_, name) in zip(all_durs, starts)
                if not any(abs(d - od) < 2_000 and name == n for od, n in open_starts)
            ]
            if open_starts and len(starts) == len(all_durs)
            else all_durs
        )
        if len(all_durs) - len(kept) > 3:  # the last cut short at a site, a double interruption
            said.append(f"thread {tid}: {len(all_durs) - len(kept)} ranges flagged open")
        durs = kept or [0]
        slack = len(durs) + 1_000_000  # rounding to the ns, and 1 ms
        if sum(durs) > wall_ns + slack or max(durs) > wall_ns:
            said.append(
                f"thread {tid}: {len(durs)} ranges sum to {sum(durs) / 1e9:.3f} s"
                f" (longest {max(durs) / 1e6:.1f} ms; {sum(d > wall_ns // 10 for d in durs)}"
                f" over a tenth of the run) in a {wall_ns / 1e9:.3f} s run;"
                f" {events.open} ranges of the file flagged open {events.open_ranges} (name, ms)"
            )
    return said


def _missing(expected: set[str], names: Counter[str]) -> list[str]:
    """Expected names absent, beyond what the placeholder name can account for."""
    absent = sorted(expected - set(names), key=_natural)
    return absent if len(absent) > names[PLACEHOLDER] else []


def _natural(name: str) -> tuple[str, int]:
    m = re.match(r"(.*?)(\d+)$", name)
    return (m.group(1), int(m.group(2))) if m else (name, -1)


def _sample(names: list[str]) -> str:
    return f"{len(names)} (e.g. {names[:3]} ... {names[-2:]})"


# --- 1: the kill stress ----------------------------------------------------------------------


@dataclass(frozen=True)
class Kill:
    signum: int
    delay: float  # seconds after the program says it is recording
    threads: int  # recording threads beside the main thread
    views: str  # flush (flush_at_exit), out (MSTX_MARKS_OUT), both
    order: str  # user_first: the library's handler chains to the user's; else the user's replaces
    iterations: int  # -1: records until killed; else the signal may land during the exit

    def __str__(self) -> str:
        return (
            f"{signal.Signals(self.signum).name} at {self.delay * 1000:.0f} ms,"
            f" {self.threads} threads, {self.views}, {self.order},"
            f" {'for ever' if self.iterations < 0 else f'{self.iterations} iterations'}"
        )


_KILL = st.builds(
    Kill,
    signum=st.sampled_from([signal.SIGTERM, signal.SIGINT]),
    delay=st.one_of(st.floats(0.0, 0.02), st.floats(0.0, 0.2)),
    threads=st.sampled_from([0, 2]),
    views=st.sampled_from(["flush", "out", "both"]),
    order=st.sampled_from(["library_first", "user_first"]),
    iterations=st.sampled_from([-1, -1, -1, 3000]),
)


@dataclass
class KillOutcome:
    kill: Kill
    folder: Path
    problems: list[str]
    exit_s: float | None = None
    process_s: float | None = None  # from start to exit
    read_s: float = 0.0  # reading its files back
    names: int = 0
    exported_later: int = 0


def _wait_for(path: Path, line: bytes, proc: subprocess.Popen[bytes], limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with path.open("rb") as f:
            if line in f.read(1 << 20):
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    return False


def run_kill(kill: Kill, root: Path, with_summary: Callable[[int], bool]) -> KillOutcome:
    root.mkdir(parents=True)
    outcome = KillOutcome(kill, root, [])
    folders = []
    env = _env(CRASH_ORDER=kill.order)
    if kill.views in ("flush", "both"):
        env["CRASH_FLUSH"] = str(root / "flush")
        folders.append(root / "flush")
    if kill.views in ("out", "both"):
        env["MSTX_MARKS_OUT"] = str(root / "out")
        folders.append(root / "out")
    report, errors = root / "stdout", root / "stderr"
    began = time.monotonic()
    with report.open("wb") as so, errors.open("wb") as se:
        proc = subprocess.Popen(
            _command("kill", kill.threads, kill.iterations), env=env, cwd=root, stdout=so, stderr=se
        )
    try:
        if not _wait_for(report, b"ready\n", proc, 60):
            outcome.problems.append(f"never said ready: exit {proc.poll()}")
        time.sleep(kill.delay)
        sent, sent_ns = time.monotonic(), time.monotonic_ns()  # one clock with the program's
        if proc.poll() is None:
            proc.send_signal(kill.signum)
        else:
            sent_ns = sys.maxsize  # it ended first: everything it said it completed counts
        try:
            rc = proc.wait(timeout=10)
            outcome.exit_s = time.monotonic() - sent
            outcome.process_s = time.monotonic() - began
        except subprocess.TimeoutExpired:
            _stacks_then_kill(proc)
            stacks = errors.read_text(errors="replace")[-8000:]
            outcome.problems.append(f"hung: no exit 10 s after the signal; stacks:\n{stacks}")
            return outcome
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    try:
        _check_kill(outcome, kill, folders, errors, report, rc, sent_ns, with_summary)
    finally:
        outcome.read_s = time.monotonic() - began - (outcome.process_s or 0)
    return outcome


def _check_kill(
    outcome: KillOutcome,
    kill: Kill,
    folders: list[Path],
    errors: Path,
    report: Path,
    rc: int,
    sent_ns: int,
    with_summary: Callable[[int], bool],
) -> None:
    stderr = errors.read_text(errors="replace")
    said = report.read_text().splitlines()
    # Completed before the signal: said with a clock read after the range ended, before it.
    completed = set()
    for line in said:
        m = re.fullmatch(r"(m|t(\d)) (\d+) (\d+)", line)
        if m and int(m.group(4)) < sent_ns:
            completed.add(f"worker{m.group(2)}_batch_{m.group(3)}" if m.group(2) else
                          f"micro_batch_{m.group(3)}")  # fmt: skip
    # The user's handler's own range, completed after the signal and before sys.exit(0): the
    # process then exits normally (atexit), so it belongs in the files too; said apart.
    checkpoint = "ckpt" in said
    # A program that had finished ("done") before the signal came may get it in the
    # interpreter's teardown, after Python has given the signals back to the system: it then
    # dies of it (-15 for SIGTERM, -2 for SIGINT), as any Python program does there, having
    # written its files.
    finished = "done" in said and rc == -kill.signum and not checkpoint
    if rc != 0 and not finished:
        outcome.problems.append(f"exit {rc} (the user's handler exits 0): {stderr[-1500:]}")
    known = re.compile(r"micro_batch_\d+|worker\d_batch_\d+|save_checkpoint")
    for folder in folders:
        try:
            files = files_of(folder, stderr, export_allowed=True)
        except AssertionError as exc:
            outcome.problems.append(str(exc))
            continue
        outcome.exported_later += files.exported_later
        outcome.names = max(outcome.names, len(files.database.names))
        if "done" in said:
            # The signal came in the program's teardown, its loop done, while the library's
            # exit write ran: a known gap (issue 35's note), its files are only required to be
            # there and whole. The property is for programs killed while they run.
            continue
        for kind, events in (("Chrome trace", files.chrome), ("database", files.database)):
            where = f"{folder.name}/ {kind}"
            names = events.names
            # Past the names the recorder keeps (65,536: the two threads name a range per step,
            # and keep going while the signal's flush runs, for seconds on a loaded machine), a
            # new name is recorded under the placeholder, said once: the range is there.
            capped = names[PLACEHOLDER] and "distinct range names were recorded" in stderr
            if checkpoint and not names["save_checkpoint"] and not capped:
                outcome.problems.append(
                    f"{where}: no save_checkpoint, the range the user's handler completed after"
                    " the signal, before sys.exit(0)"
                )
            missing = _missing(completed, names)
            if missing:
                outcome.problems.append(
                    f"{where}: {_sample(missing)} of the {len(completed)} ranges completed before"
                    f" the signal are missing; it holds {events.total} ranges"
                    f" ({names[PLACEHOLDER]} under {PLACEHOLDER!r})"
                )
            twice = sorted(n for n, c in names.items() if c > 1 and n != PLACEHOLDER)
            strange = sorted(n for n in names if n != PLACEHOLDER and not known.fullmatch(str(n)))
            if twice or strange:
                outcome.problems.append(f"{where}: names twice {twice[:5]}, unknown {strange[:5]}")
            for starts in events.starts.values():
                order = [_natural(n)[1] for _, n in sorted(starts) if str(n).startswith("micro_")]
                if order != sorted(order):
                    outcome.problems.append(f"{where}: micro_batch ranges out of order")
                    break
        if with_summary(len(files.database.names)):
            try:
                counts = summary_counts(summary(folder))
            except AssertionError as exc:
                outcome.problems.append(str(exc))
                continue
            missing = _missing(completed, counts)
            if missing:
                outcome.problems.append(
                    f"{folder.name}/ summary --json: {_sample(missing)} of {len(completed)} missing"
                )


def test_1_kill_stress_every_process_exits_and_keeps_every_completed_range(
    tmp_path: Path,
) -> None:
    outcomes: list[KillOutcome] = []
    summaries = [0]

    def with_summary(names: int) -> bool:
        if names <= 6000 and summaries[0] < KILL_SUMMARIES:
            summaries[0] += 1
            return True
        return False

    @settings(_SETTINGS, max_examples=max(1, KILLS // 2))
    @given(pair=st.tuples(_KILL, _KILL))
    def two_at_a_time(pair: tuple[Kill, Kill]) -> None:
        base = len(outcomes)
        with ThreadPoolExecutor(2) as pool:
            done = list(
                pool.map(
                    lambda ik: run_kill(ik[1], tmp_path / f"kill{base + ik[0]}", with_summary),
                    enumerate(pair),
                )
            )
        outcomes.extend(done)

    started = time.monotonic()
    two_at_a_time()
    took = time.monotonic() - started
    exits = sorted(o.exit_s for o in outcomes if o.exit_s is not None)
    running = sorted(o.process_s for o in outcomes if o.process_s is not None)
    print(
        f"\nkill stress: {len(outcomes)} kills in {took:.1f} s"
        f" ({took / len(outcomes) * 200:.0f} s for 200 at this rate);"
        f" exits after the signal: median {exits[len(exits) // 2] if exits else 0:.2f} s,"
        f" slowest {exits[-1] if exits else 0:.2f} s;"
        f" {sum(o.exported_later for o in outcomes)} views completed by export;"
        f" per kill: median {running[len(running) // 2] if running else 0:.2f} s running,"
        f" {sum(o.read_s for o in outcomes) / len(outcomes):.2f} s reading back;"
        f" {summaries[0]} checked with summary --json"
    )
    failed = [o for o in outcomes if o.problems]
    hung = [o for o in failed if any(p.startswith("hung") for p in o.problems)]
    if failed:
        pytest.fail(
            f"{len(failed)} of {len(outcomes)} killed processes failed ({len(hung)} hung):\n"
            + "\n".join(f"- [{o.kill}] {o.folder.name}: " + "\n  ".join(o.problems) for o in failed)
        )


# --- 2: many new names in one write ----------------------------------------------------------


def test_2_new_names_past_the_cap_in_one_write_keep_every_event(tmp_path: Path) -> None:
    """``flush_at_exit(out, interval=None)`` (documented: spilled only at a flush) puts every new
    name in the exit's one write, as the periodic spill does on a machine fast enough. The names
    kept make a table longer than a reader reads as one line (the issue's 300,000 new names lost
    every event so, past the 65,536 kept): here 14,000 names of 156 characters (MSTX's longest)
    are kept, and 6,000 more go under the placeholder. Read back from the files, and
    from the spill alone (what ``summary`` reads of a process killed before its exit wrote)."""
    n, kept, digits = 20_000, 14_000, 144
    env = _env(
        CRASH_FLUSH=str(tmp_path / "out"), CRASH_INTERVAL="none", MSTX_MARKS_RECORD_NAMES=str(kept)
    )
    run = _run("names", n, digits, env=env, cwd=tmp_path)
    shutil.copytree(tmp_path / "out" / "spill", tmp_path / "killed" / "spill")
    with ThreadPoolExecutor(2) as pool:  # summary's processes run beside the reading here
        summarised = pool.submit(summary, tmp_path / "out")
        spill_only = pool.submit(summary, tmp_path / "killed")
        files = files_of(tmp_path / "out", run.err, export_allowed=False, detail=False)
        got = summarised.result()
        from_spill = summary_counts(spill_only.result())
    for where, names in (
        ("Chrome trace", files.chrome.names),
        ("database", files.database.names),
        ("summary --json", summary_counts(got)),
        ("summary --json of the spill alone", from_spill),
    ):
        named = sum(c for k, c in names.items() if k != PLACEHOLDER)
        assert sum(names.values()) == n, (
            f"{where}: {sum(names.values())} of {n} events ({named} named,"
            f" {names[PLACEHOLDER]} under {PLACEHOLDER!r}); stderr: {run.err[-2000:]}"
        )
        # The first names are kept as they are, each once; past the cap, the placeholder.
        assert names[PLACEHOLDER] > 0, f"{where}: {n} distinct names and none past the cap?"
        first = set(names) - {PLACEHOLDER} == {f"micro_batch_{i:0{digits}d}" for i in range(named)}
        assert first, f"{where}: the named ones are not the first {named}"
        assert max(c for k, c in names.items() if k != PLACEHOLDER) == 1, where
        # (a line is skipped for sure past MAX_LINE and the block of 1 MiB read with it)
        table = sum(len(json.dumps(k)) + 1 for k in names if k != PLACEHOLDER)
        assert table > 2 * MAX_LINE, f"{where}: {named} names, a table of {table} bytes"
    assert not summary_losses(got), summary_losses(got)


# --- 3: interrupted starts -------------------------------------------------------------------


def _after_ranges_all_there(run: Run, folder: Path, after: int) -> Files:
    with ThreadPoolExecutor(1) as pool:  # summary's process runs beside the reading here
        summarised = pool.submit(summary, folder)
        files = files_of(folder, run.err, export_allowed=False)
        counts = summary_counts(summarised.result())
    expected = Counter({f"after_{j}": 1 for j in range(after)})
    for where, names in (
        ("Chrome trace", files.chrome.names),
        ("database", files.database.names),
        ("summary --json", counts),
    ):
        got = Counter({k: v for k, v in names.items() if k.startswith("after_")})
        whole = got == expected
        assert whole, (
            f"{where}: {sum(got.values())} of the {after} ranges recorded after the interruptions"
            f" ({len(expected - got)} missing, e.g. {sorted(expected - got, key=_natural)[:3]});"
            f" it holds {sum(names.values())} ranges; stderr: {run.err[-1500:]}"
        )
    return files


#: Every headroom below the recursion limit at which entering a range can fail (-1: a dive
#: through ranges of new names), each with a Mark made there and one made at the top.
_SWEEP = [(headroom, shallow) for headroom in range(-1, 16) for shallow in (0, 1)]


@settings(_SETTINGS, max_examples=3)
@given(attempts=st.permutations(_SWEEP), view=st.sampled_from(["flush", "out"]))
def test_3a_recursion_errors_through_new_ranges_leave_later_ranges_recorded(
    attempts: list[tuple[int, int]], view: str
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "out"
        env = _env(**{"CRASH_FLUSH" if view == "flush" else "MSTX_MARKS_OUT": str(folder)})
        sweep = ",".join(f"{h}:{s}" for h, s in attempts)
        run = _run("recursion", sweep, 100, env=env, cwd=Path(tmp), timeout=60)
        assert run.value("recursion_errors") >= 5, "the sweep should reach the limit"
        _after_ranges_all_there(run, folder, 100)


ALARMS = 500


@settings(_SETTINGS, max_examples=3)
@given(
    interval_us=st.integers(50, 400),
    threads=st.integers(0, 2),
    view=st.sampled_from(["flush", "out"]),
)
def test_3b_a_sigalrm_handler_that_raises_1500_times_leaves_later_ranges_and_sane_durations(
    interval_us: int, threads: int, view: str
) -> None:
    """Three runs of ALARMS raises: the issue's 1,500 in all (its threads record meanwhile, for
    ``summary`` and the files to read back: 120,000 ranges in a run of 1,500)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "out"
        env = _env(**{"CRASH_FLUSH" if view == "flush" else "MSTX_MARKS_OUT": str(folder)})
        run = _run("alarm", interval_us, ALARMS, 1000, threads, env=env, cwd=Path(tmp), timeout=60)
        swallowed = run.value("swallowed")
        assert not swallowed, (
            f"{swallowed} of the {ALARMS} RewardTimeouts raised by the handler never reached the"
            f" program; stderr: {run.err[-2000:]}"
        )
        assert run.value("caught") == ALARMS
        files = _after_ranges_all_there(run, folder, 1000)
        wall, problems = run.value("wall_ns"), []
        opened = files.chrome.open_starts  # (the database keeps no open flag)
        for where, events in (("Chrome trace", files.chrome), ("database", files.database)):
            problems += [f"{where}: {a}" for a in absurd_durations(events, wall, opened)]
            for k in range(threads):
                got = sum(c for n, c in events.names.items() if n.startswith(f"worker{k}_"))
                if got != run.value(f"worker{k}"):
                    problems.append(f"{where}: worker{k} {got} of {run.value(f'worker{k}')}")
        assert not problems, "\n".join(problems)


#: Ctrl-Cs per storm. Between them the program records as fast as it can (each storm of 1,500
#: left about 250,000 ranges for the files and ``summary`` to read); the test's two storms send
#: the issue's 1,500 in all.
STORM = 750


def _storm(proc: subprocess.Popen[bytes], storms: int, max_delay_us: int, seed: int) -> str:
    """Send Ctrl-C ``storms`` times, each after the program acknowledged the one before."""
    import random

    rng = random.Random(seed)
    assert proc.stdout is not None
    fd, buf = proc.stdout.fileno(), b""

    def line_with(token: bytes, limit: float) -> None:
        nonlocal buf
        deadline = time.monotonic() + limit
        while token not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise AssertionError(f"waited for {token!r}: {buf[-300:]!r}, exit {proc.poll()}")
            if select.select([fd], [], [], left)[0]:
                buf += os.read(fd, 65536)

    line_with(b"ack 0\n", 60)  # ready
    for k in range(1, storms + 1):
        time.sleep(rng.uniform(0, max_delay_us) / 1e6)
        proc.send_signal(signal.SIGINT)
        try:
            line_with(f"ack {k}\n".encode(), 10)
        except AssertionError as exc:
            raise AssertionError(f"Ctrl-C {k} of {storms} was never caught: {exc}") from None
        buf = buf[buf.index(f"ack {k}\n".encode()) :]
    return buf.decode()


@settings(_SETTINGS, max_examples=2)
@given(
    max_delay_us=st.integers(0, 600),
    threads=st.integers(0, 1),
    view=st.sampled_from(["flush", "out"]),
    seed=st.integers(0, 2**32),
)
def test_3c_a_ctrl_c_storm_from_another_process_leaves_later_ranges_and_sane_durations(
    max_delay_us: int, threads: int, view: str, seed: int
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "out"
        env = _env(**{"CRASH_FLUSH" if view == "flush" else "MSTX_MARKS_OUT": str(folder)})
        run = _storm_run(1000, threads, env, Path(tmp), max_delay_us, seed)
        files = _after_ranges_all_there(run, folder, 1000)
        wall, problems = run.value("wall_ns"), []
        for where, events in (("Chrome trace", files.chrome), ("database", files.database)):
            if not events.names["storm"]:
                problems.append(f"{where}: no storm range")
            opened = files.chrome.open_starts  # (the database keeps no open flag)
            problems += [f"{where}: {a}" for a in absurd_durations(events, wall, opened)]
            for k in range(threads):
                got = events.names[f"worker{k}"]
                if got != run.value(f"worker{k}"):
                    problems.append(f"{where}: worker{k} {got} of {run.value(f'worker{k}')}")
        assert not problems, "\n".join(problems)


def test_3c_a_ctrl_c_storm_without_recording_reaches_the_program_every_time(
    tmp_path: Path,
) -> None:
    """No output asked for (nothing recorded, the device backend only): every Ctrl-C is still
    the program's, and the program finishes."""
    for seed in range(3):
        _storm_run(10, 0, _env(), tmp_path, 0, seed)


def _storm_run(
    after: int, threads: int, env: dict[str, str], cwd: Path, max_delay_us: int, seed: int
) -> Run:
    """The storm program under STORM Ctrl-Cs, to its end; fails, with its stacks, if one is
    never caught or it does not finish."""
    errors = cwd / f"storm{seed}.stderr"
    with errors.open("wb") as se:  # a file: nothing the program says can block it
        proc = subprocess.Popen(
            _command("storm", STORM, after, threads), env=env, cwd=cwd,
            stdout=subprocess.PIPE, stderr=se,
        )  # fmt: skip
    try:
        head = _storm(proc, STORM, max_delay_us, seed)
        out, _ = proc.communicate(timeout=120)
    except (AssertionError, subprocess.TimeoutExpired) as exc:
        _stacks_then_kill(proc)
        pytest.fail(f"{exc}\nstderr:\n{_head_and_tail(errors.read_text(errors='replace'))}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run = Run(proc.returncode, head + out.decode(), errors.read_text(errors="replace"), 0.0)
    assert run.rc == 0 and "done" in run.lines, f"exit {run.rc}\n{_head_and_tail(run.err)}"
    return run


def _head_and_tail(text: str, each: int = 2500) -> str:
    return text if len(text) <= 2 * each else f"{text[:each]}\n[...]\n{text[-each:]}"


# --- 4, 5: past the recorder's capacity ------------------------------------------------------


def _every_event(run: Run, folder: Path, expected: Counter[str]) -> None:
    """The folder's Chrome trace, database and summary hold ``expected``, and say no loss."""
    with ThreadPoolExecutor(1) as pool:  # summary's process runs beside the reading here
        summarised = pool.submit(summary, folder)
        files = files_of(folder, run.err, export_allowed=False, detail=False)
        got = summarised.result()
    n = sum(expected.values())
    for where, names, dropped in (
        ("Chrome trace", files.chrome.names, files.chrome.dropped),
        ("database", files.database.names, files.database.dropped),
        ("summary --json", summary_counts(got), 0),
    ):
        whole = names == expected and not dropped
        assert whole, (
            f"{folder.name}/ {where}: {sum(names.values())} of {n} events, {dropped} said dropped;"
            f" stderr: {run.err[-2000:]}"
        )
    assert not summary_losses(got), f"{folder.name}/ summary --json: {summary_losses(got)}"


def test_4_flush_at_exit_under_mstx_marks_out_past_twice_the_capacity_writes_both(
    tmp_path: Path,
) -> None:
    # Three times a capacity a tight loop passes without a drop on a loaded machine (test 5's;
    # at 20,000, two chunks, the spill fell behind there), past twice its chunks' 65,536.
    n, names = 150_000, 1000
    env = _env(CRASH_FLUSH="out", MSTX_MARKS_OUT="OUT", MSTX_MARKS_RECORD_CAPACITY="50000")
    run = _run("loop", n, names, env=env, cwd=tmp_path)
    expected = Counter({f"name_{k}": n // names for k in range(names)})
    missing = [f for f in ("out", "OUT") if not list((tmp_path / f).glob(CHROME))]
    assert not missing, (
        f"no Chrome trace at exit in {missing}: out/ {_listing(tmp_path / 'out')},"
        f" OUT/ {_listing(tmp_path / 'OUT')}\nstderr: {run.err[-2000:]}"
    )
    for folder in ("out", "OUT"):
        _every_event(run, tmp_path / folder, expected)


@pytest.mark.parametrize("view", ["MSTX_MARKS_OUT", "flush_at_exit"])
def test_5_a_tight_loop_past_the_capacity_drops_nothing(tmp_path: Path, view: str) -> None:
    n = 200_000
    env = _env(MSTX_MARKS_RECORD_CAPACITY="50000")
    env["MSTX_MARKS_OUT" if view == "MSTX_MARKS_OUT" else "CRASH_FLUSH"] = str(tmp_path / "out")
    run = _run("loop", n, 1, env=env, cwd=tmp_path)
    said = [line for line in run.err.splitlines() if "dropped" in line or "fell behind" in line]
    assert not said, said
    _every_event(run, tmp_path / "out", Counter({"tight_step": n}))


def test_export_of_a_folder_named_as_a_user_types_it_writes_the_files(tmp_path: Path) -> None:
    """A process that left only a spill (``os._exit``, as Ray's actors leave), then
    ``python -m mstx_marks export out`` typed in the folder above it: a relative name."""
    env = _env(MSTX_MARKS_OUT="out", CRASH_QUICK_EXIT="1")
    run = _run("loop", 3000, 30, env=env, cwd=tmp_path)
    assert not list((tmp_path / "out").glob(CHROME)), "os._exit ran the exit write?"
    proc = subprocess.run(
        [sys.executable, "-m", "mstx_marks", "export", "out"],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, f"export out: exit {proc.returncode}\n{proc.stderr}"
    files = files_of(tmp_path / "out", run.err + proc.stderr, export_allowed=False)
    expected = Counter({f"name_{k}": 100 for k in range(30)})
    for where, events in (("Chrome trace", files.chrome), ("database", files.database)):
        whole = events.names == expected
        assert whole, f"{where}: {events.total} of 3000 events; export said: {proc.stdout}"


# --- 6: the long run -------------------------------------------------------------------------


def long_run(root: Path, n: int, distinct: int, **env: str) -> Run:
    """``n`` events cycling ``distinct`` names, through ``flush_at_exit`` (``flush/``) and
    ``MSTX_MARKS_OUT`` (``out/``) at once: both folders' Chrome trace, database and ``summary
    --json`` hold every event, the names past the recorder's cap under the placeholder. Returns
    the run: its peak resident memory is ``run.value("peak_mib")``, the exit's writes included.
    Also ``benchmarks/long_run.py``'s (the issue's 3 million events and 200,000 names)."""
    run = _long_program(root, n, distinct, env)
    at_exit = {f: bool(list((root / f).glob(CHROME))) for f in ("flush", "out")}
    with ThreadPoolExecutor(2) as pool:  # both summaries run beside the reading of the files
        summaries = {f: pool.submit(summary, root / f) for f in ("flush", "out")}
        for folder in ("flush", "out"):
            files = files_of(root / folder, run.err, export_allowed=True, detail=False)
            for where, names in (
                ("Chrome trace", files.chrome.names),
                ("database", files.database.names),
            ):
                named = {k: c for k, c in names.items() if k != PLACEHOLDER}
                assert sum(names.values()) == n, (
                    f"{folder}/ {where}: {sum(names.values())} of {n} events (at exit: {at_exit});"
                    f" stderr: {run.err[-2000:]}"
                )
                assert set(named.values()) == {n // distinct}, f"{folder}/ {where}: counts by name"
                assert names[PLACEHOLDER] == n - sum(named.values()) > 0, f"{folder}/ {where}"
        for folder, got in summaries.items():
            counts = summary_counts(got.result())
            assert sum(counts.values()) == n, f"{folder}/ summary --json: {sum(counts.values())}"
    return run


#: The long run's recorder: a capacity a tight loop passes many times (test 5: none dropped at
#: this one), and names kept (the issue's run: 3e6 events, 200,000 names, past 65,536 of them).
LONG_CAPACITY, LONG_NAMES = 50_000, 5_000
#: How much more memory the long run may take than a run of a quarter of its length: held, its
#: 112,500 more events took 37 MiB more (measured with the exit's export reading the spill
#: whole); streamed, 4 or 5.
LONG_GROWTH_MIB = 16


def test_6_a_run_many_times_the_capacity_and_past_the_names_in_memory_that_does_not_grow(
    tmp_path: Path,
) -> None:
    """150,000 events, three times the recorder's capacity, cycling 15,000 names, three times
    the names it keeps (as the issue's run: 3e6 events, 200,000 names, with the defaults): every
    event in both views. Its peak, the exit's writes included, is that of a run of a
    quarter of its length, beside it: what it holds does not grow with the run (a figure for 3
    million events is ``benchmarks/long_run.py``'s)."""
    n, distinct = 150_000, 15_000
    env = {
        "MSTX_MARKS_RECORD_CAPACITY": str(LONG_CAPACITY),
        "MSTX_MARKS_RECORD_NAMES": str(LONG_NAMES),
        "MSTX_MARKS_EXIT_SECONDS": "600",  # the exit writes its files: its peak counts them
    }
    with ThreadPoolExecutor(1) as pool:  # (on a second CPU)
        quarter = pool.submit(_long_program, tmp_path / "quarter", n // 4, distinct, env)
        run = long_run(tmp_path / "long", n, distinct, **env)
        short = quarter.result().value("peak_mib")
    peak = run.value("peak_mib")
    print(f"\nlong run: {n} events: peak {peak} MiB; {n // 4} events: peak {short} MiB")
    assert peak <= short + LONG_GROWTH_MIB, (
        f"peak {peak} MiB for {n} events, {short} MiB for {n // 4}"
        f" (after import {run.value('start_mib')} MiB)"
    )


def _long_program(root: Path, n: int, distinct: int, env: dict[str, str]) -> Run:
    """:func:`long_run`'s program, run to its end in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    env = _env(CRASH_FLUSH="flush", MSTX_MARKS_OUT="out", CRASH_PEAK="1", **env)
    return _run("loop", n, distinct, env=env, cwd=root, timeout=900)
