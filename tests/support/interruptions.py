"""Interruptions where CPython delivers them, and what a user then reads in the files.

CPython runs a signal handler (and so raises its exception), or raises a ``RecursionError``,
only at a few points of the bytecode: right after a call returns (``CALL``'s eval-breaker
check), at a function's entry (``RESUME``: where a frame is pushed, and where the depth is
checked) and at a backward jump (``JUMP_BACKWARD``, ``POP_JUMP_BACKWARD_IF_*``), never between
two other opcodes. :class:`Probe` finds every such point that the library's own frames pass
(a dry run of a scenario: ``sys.settrace`` with ``f_trace_opcodes``, plus ``sys.setprofile``
for the returns), then raises at exactly one of them per case, attributed to the instruction
CPython would attribute it to:

- *after a call*: raised by the profiler at the callee's own return (``return`` of a Python
  callee, ``c_return`` of a builtin): the exception lands in the caller at the ``CALL``, the
  call's work done, as the eval-breaker check after ``CALL`` does; a call with no such event (a
  type called from C: ``array(...)``) raises at the caller's next instruction instead;
- *at entry*: raised at the ``call`` trace event, before the callee's first instruction: the
  caller sees it at its ``CALL``, nothing of the callee done (a RecursionError when the frame is
  pushed; a signal at ``RESUME``). A Python callee outside the library, called from a library
  frame, is such a point too (``push``);
- *at a backward jump*: raised at the jump's opcode event, on a pass where it is taken.

Scenarios (:class:`Program`): ``range`` (a shared Mark entered twice, a new name, an instant,
``Mark.start``, a decorated call), ``flush`` (the user's ``flush()`` mid-run, a range held
open across it), ``sigterm`` (the library's SIGTERM handling, chained before the user's own
handler, which records and carries on) and ``exit`` (the exit's write). Each case of the first
three runs in this process in a fresh session with its own out folder (``flush_at_exit``): the
user's exception must reach the scenario's caller unchanged; then 100 later ranges and more
entries of the same objects are recorded and the exit hooks run as the interpreter's do. A case
of the exit is a real exit, in a forked child (the later ranges recorded before it; a Ctrl-C
only: the stack has unwound, no RecursionError reaches there). Each folder is then read back by
another process (:func:`read`: ``mstx-marks summary --json`` and the Chrome trace), never by
asking the recorder. A Ctrl-C where the library holds SIGINT back (``signals_deferred``) cannot
happen, and such cases are left out; a RecursionError there can.

Also here: a ``setitimer`` storm whose handler raises only while a library frame is on top
(:func:`itimer`), and a recursion-limit sweep (:func:`recursion`).

Run as ``python tests/support/interruptions.py MODE ...`` (``collect``, ``cases``,
``exitcases``, ``read``, ``itimer``, ``recursion``); tests/test_fault_injection.py drives it.
"""

from __future__ import annotations

import atexit
import contextlib
import dis
import faulthandler
import io
import json
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

if __name__ == "__main__":  # run as a script: the tests' folder holds ``support``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mstx_marks

PACKAGE = Path(mstx_marks.__file__).resolve().parent
#: The library's frames where interruptions are injected: the range path and the give-up
#: path (ranges.py, record.py), the drain (record.py), the spill's write (spill.py) and the
#: exit and flush path (out.py, signals.py, writer.py), in so far as they run on the thread that
#: a signal handler or a RecursionError interrupts: the one running the scenario.
FILES = ("core/ranges.py", "backends/record.py", "export/spill.py", "export/out.py",
         "export/signals.py", "export/process_files.py", "export/writer.py")  # fmt: skip
_TARGETS = {str(PACKAGE / rel) for rel in FILES}

_CALLS = {dis.opmap["CALL"], dis.opmap["CALL_FUNCTION_EX"]}
_BACK = {op for name, op in dis.opmap.items() if name in (
    "JUMP_BACKWARD", "POP_JUMP_BACKWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE")}  # fmt: skip


class Interrupt(KeyboardInterrupt):
    """The user's Ctrl-C (a KeyboardInterrupt the program catches and carries on after)."""


KINDS: dict[str, Callable[[], BaseException]] = {
    "interrupt": lambda: Interrupt("injected"),
    "recursion": lambda: RecursionError("maximum recursion depth exceeded (injected)"),
}


def _where(code: CodeType) -> str:
    return f"{Path(code.co_filename).relative_to(PACKAGE)}:{code.co_qualname}"


@dataclass(frozen=True)
class Site:
    """One point where CPython may raise, in a library frame, first met in ``scenario``.

    ``code``/``offset``: the frame's function and its instruction (the ``CALL``, the jump, 0
    for an entry); ``via`` how :class:`Probe` raises there (module docstring) and ``nth``
    which of the events counted so (from 1) is the first pass of this site."""

    scenario: str
    kind: str  # after-call, entry, push, loop
    code: str
    line: int
    offset: int
    what: str  # the callee, the jump
    via: str  # return, next-op, call-event, opcode
    nth: int

    @property
    def name(self) -> str:
        return f"{self.scenario}:{self.code}:{self.line}@{self.offset}:{self.kind}:{self.what}"


class _Code:
    """What the probe needs of one code object: its key and each instruction's next offset."""

    __slots__ = ("code", "key", "next", "ops")

    def __init__(self, code: CodeType) -> None:
        self.code, self.key = code, _where(code)
        self.ops: dict[int, int] = {}
        self.next: dict[int, int] = {}
        prev = None
        for ins in dis.get_instructions(code):
            self.ops[ins.offset] = ins.opcode
            if prev is not None:
                self.next[prev] = ins.offset
            prev = ins.offset


class Probe:
    """Collects the sites a scenario passes (``target=None``), or raises ``exc`` at one.

    A context manager around the scenario, on the thread that runs it (the main thread)."""

    def __init__(self, scenario: str, target: Site | None = None,
                 exc: BaseException | None = None,
                 said: Callable[[dict[str, Any]], None] | None = None) -> None:  # fmt: skip
        self.scenario, self.target, self.exc = scenario, target, exc
        #: Told each site found and each firing, as it happens (at a real exit nothing of
        #: the probe's runs afterwards to say it).
        self.said = said
        self.sites: dict[tuple[str, int, str], Site] = {}
        self.fired = False
        #: Whether the library held SIGINT/SIGTERM back (signals_deferred) when it fired.
        self.deferred = False
        self._codes: dict[CodeType, _Code | None] = {}
        self._counts: dict[tuple[str, int, str], int] = {}
        # Per frame: the CALL or jump just executed (offset, its pass) and the returns seen.
        self._pending: dict[FrameType, list[Any]] = {}

    # -- bookkeeping ------------------------------------------------------------------------

    def _info(self, code: CodeType) -> _Code | None:
        try:
            return self._codes[code]
        except KeyError:
            info = self._codes[code] = _Code(code) if code.co_filename in _TARGETS else None
            return info

    def _count(self, key: tuple[str, int, str]) -> int:
        n = self._counts[key] = self._counts.get(key, 0) + 1
        return n

    def _site(self, kind: str, info: _Code, offset: int, what: str, via: str, nth: int) -> None:
        key = (info.key, offset, kind)
        if key not in self.sites:
            line = max(((off, ln) for off, ln in dis.findlinestarts(info.code)
                        if off <= offset and ln is not None),
                       default=(0, info.code.co_firstlineno))[1]  # fmt: skip
            self.sites[key] = Site(self.scenario, kind, info.key, line, offset, what, via, nth)
            if self.said is not None:
                self.said({"site": asdict(self.sites[key])})

    def _is(self, kind: str, info: _Code, offset: int, nth: int) -> bool:
        t = self.target
        return (
            t is not None and not self.fired and t.kind == kind and t.code == info.key
            and t.offset == offset and t.nth == nth
        )  # fmt: skip

    def _fire(self) -> None:
        self.fired = True
        handler = signal.getsignal(signal.SIGINT)
        self.deferred = getattr(handler, "__module__", "").startswith("mstx_marks") and not (
            hasattr(handler, "mstx_previous")
        )
        sys.settrace(None)
        sys.setprofile(None)
        if self.said is not None:
            self.said({"fired": True, "deferred": self.deferred})
        assert self.exc is not None
        raise self.exc

    # -- the hooks --------------------------------------------------------------------------

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        """``call`` events: a library frame's entry, or a library frame pushing another."""
        info = self._info(frame.f_code)
        if info is not None:
            n = self._count((info.key, 0, "entry"))
            if self.target is None:
                self._site("entry", info, 0, frame.f_code.co_name, "call-event", n)
            elif self._is("entry", info, 0, n):
                self._fire()
            frame.f_trace_opcodes, frame.f_trace_lines = True, False
            self._pending.pop(frame, None)
            return self._local
        caller = frame.f_back
        if caller is not None and (cinfo := self._info(caller.f_code)) is not None:
            off = caller.f_lasti
            n = self._count((cinfo.key, off, "push"))
            if self.target is None:
                self._site("push", cinfo, off, frame.f_code.co_qualname, "call-event", n)
            elif self._is("push", cinfo, off, n):
                self._fire()
        return None

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "opcode":
            if event in ("return", "exception"):
                self._pending.pop(frame, None)
            return self._local
        info = self._codes[frame.f_code]
        assert info is not None
        off = frame.f_lasti
        pending = self._pending.pop(frame, None)
        if pending is not None:
            at, nth, returns, what, kind = pending
            if kind == "after-call" and info.next.get(at) == off:  # the call returned
                if self.target is None:
                    if returns:
                        self._site(kind, info, at, what, "return", returns)
                    else:
                        self._site(kind, info, at, what, "next-op", nth)
                elif self.target.via == "next-op" and self._is(kind, info, at, nth):
                    self._fire()
            elif kind == "loop" and off <= at and self.target is None:  # the jump was taken
                self._site(kind, info, at, what, "opcode", nth)
        op = info.ops.get(off)
        if op in _CALLS:
            nth = self._count((info.key, off, "call"))
            self._pending[frame] = [off, nth, 0, "", "after-call"]
        elif op in _BACK:
            nth = self._count((info.key, off, "loop"))
            if self._is("loop", info, off, nth):
                self._fire()
            self._pending[frame] = [off, nth, 0, dis.opname[op], "loop"]
        return self._local

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        """A call's return: the callee's (``return``) or a builtin's (``c_return``)."""
        if event == "return":
            caller = frame.f_back
            what = frame.f_code.co_qualname
        elif event == "c_return":
            caller, what = frame, getattr(arg, "__qualname__", repr(arg))
        else:
            return
        if caller is None:
            return
        pending = self._pending.get(caller)
        if pending is None or pending[4] != "after-call":
            return
        info = self._codes[caller.f_code]
        assert info is not None
        # (a Python callee's caller is past the CALL's inline caches: still the CALL)
        if not pending[0] <= caller.f_lasti < info.next.get(pending[0], pending[0] + 1):
            return
        n = self._count((info.key, pending[0], "return"))
        pending[2], pending[3] = n, what
        t = self.target
        if t is not None and t.via == "return" and self._is("after-call", info, pending[0], n):
            self._fire()

    def __enter__(self) -> Probe:
        sys.settrace(self._global)
        if self.target is None or self.target.via == "return":
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)
        sys.setprofile(None)


# --- the scenarios ---------------------------------------------------------------------------


class Program:
    """One case's program: a session writing ``folder``, the objects it records with."""

    def __init__(self, folder: Path, scenario: str) -> None:
        from mstx_marks import mark, mstx_range
        from mstx_marks.export import flush_at_exit
        from support.isolation import fresh

        fresh()
        self.scenario, self.folder = scenario, folder
        self.checkpoints = 0
        if scenario == "sigterm":  # the user's own handler, there before the library's
            signal.signal(signal.SIGTERM, self._on_sigterm)
            out = sys.modules["mstx_marks.export.out"]
            getattr(out, "_chained", set()).discard(signal.SIGTERM)  # chain again, per case
        self.flush = flush_at_exit(folder)
        self.shared = mark("shared")
        self.started = mark("started")
        self.decorated = mstx_range("decorated")(lambda: None)
        for _ in range(10):  # completed before the interruption: must be in the files
            with mark("before"):
                pass
        self.held = self.started.start() if scenario == "flush" else None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        from mstx_marks import mark

        with mark("save_checkpoint"):  # a handler that records (a job's own SIGTERM handling)
            self.checkpoints += 1

    def action(self) -> None:
        """What the probe watches (and interrupts)."""
        from mstx_marks import instant, mark

        if self.scenario == "range":
            # a second entry of one Mark (its overflow entries), a name new to the recorder
            with self.shared, self.shared, mark("fresh"):
                instant("tick")
            self.started.start().end()
            self.decorated()
        elif self.scenario == "flush":  # the user's flush() mid-run: drain, spill, export
            instant("with_args", args={"step": 1})
            self.flush()
        elif self.scenario == "sigterm":  # the library's SIGTERM handling, then the user's
            signal.raise_signal(signal.SIGTERM)
        else:
            raise ValueError(self.scenario)

    def after(self) -> None:
        """The program goes on: later ranges, then the exit."""
        from mstx_marks import mark

        if self.held is not None:
            self.held.end()
        for _ in range(100):
            with mark("later"):
                pass
        for _ in range(20):
            with self.shared:
                pass
            self.decorated()

    @staticmethod
    def exit() -> None:
        """The interpreter's exit hooks, as at exit (each later session registers its own)."""
        atexit._run_exitfuncs()


SCENARIOS = ("range", "flush", "sigterm", "exit")
#: What each scenario's files must hold (name: (least, most)), whatever was interrupted.
EXPECTED: dict[str, dict[str, tuple[int, int]]] = {
    "range": {"before": (10, 10), "later": (100, 100), "shared": (20, 22),
              "decorated": (20, 21), "started": (0, 1), "fresh": (0, 1)},
    "flush": {"before": (10, 10), "later": (100, 100), "shared": (20, 20),
              "decorated": (20, 20), "started": (1, 1)},
    "sigterm": {"before": (10, 10), "later": (100, 100), "shared": (20, 20),
                "decorated": (20, 20), "save_checkpoint": (0, 1)},
    "exit": {"before": (10, 10), "later": (100, 100), "shared": (20, 20),
             "decorated": (20, 20)},
}  # fmt: skip
#: Scenarios whose exception no user code can catch: the exit (the later ranges recorded
#: first, then a real exit interrupted: an exit hook's exception is printed by the
#: interpreter). Their files may lack the Chrome trace (the exit's export cut short): the
#: summary, which then reads the spill, must still hold every range.
AT_EXIT = {"exit"}
#: Seconds an exit case may take before it is said to hang (see exit_case).
_EXIT_LIMIT = 30


@contextlib.contextmanager
def _watchdog(seconds: float) -> Iterator[None]:
    """A hang is a failure: dump every thread and leave (the driver restarts after the case)."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def run_case(folder: Path, scenario: str, site: Site | None, kind: str | None) -> dict[str, Any]:
    """One case, in this process: a fresh session on ``folder``, the scenario interrupted at
    ``site`` (by an exception of ``kind``), later ranges, the exit's hooks. What the user saw,
    as a dict. (The exit scenario's cases are each a real exit: :func:`exit_case`.)"""
    folder.mkdir(parents=True)
    result: dict[str, Any] = {"folder": str(folder), "scenario": scenario}
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        program = Program(folder, scenario)
        exc = KINDS[kind]() if kind is not None else None
        probe = Probe(scenario, site, exc)
        try:
            with probe:
                program.action()
        except BaseException as got:
            if got is exc:
                result["user"] = "reached"
            else:
                result["user"] = f"changed to {type(got).__name__}: {got}"[:300]
                result["traceback"] = "".join(traceback.format_exception(got))[-1500:]
        else:
            result["user"] = "swallowed" if probe.fired else "completed"
        result["fired"], result["deferred"] = probe.fired, probe.deferred
        if site is None:
            result["sites"] = [asdict(s) for s in probe.sites.values()]
        try:
            program.after()
        except BaseException as late:  # recording must go on without a word to the user
            result["after"] = f"{type(late).__name__}: {late}"[:300]
        program.exit()
    result["warnings"] = sorted({str(w.message)[:240] for w in said})
    return result


# --- the driver, and the reader of the files ---------------------------------------------


def collect(out: Path, root: Path) -> list[Site]:
    """Every site of every scenario (a dry run each, after a warm-up run: a first range of the
    process takes paths no later one does); a site met by two scenarios run here (the
    writer's request, by a flush and by the SIGTERM's handler) is tried in the first; the
    exit's sites are all its own."""
    sites: list[Site] = []
    seen: set[tuple[str, int, str]] = set()
    for scenario in SCENARIOS:
        if scenario in AT_EXIT:
            continue
        run_case(root / f"warm-{scenario}", scenario, None, None)
        found = run_case(root / f"collect-{scenario}", scenario, None, None)
        for site in (Site(**s) for s in found["sites"]):
            if (site.code, site.offset, site.kind) not in seen:  # once, in its first scenario
                seen.add((site.code, site.offset, site.kind))
                sites.append(site)
    out.write_text("".join(json.dumps(asdict(s)) + "\n" for s in sites))
    seen = set()  # the exit's own: a flush's request and wait, asked by the exit's close

    def found_at_exit(said: dict[str, Any]) -> None:
        site = Site(**said["site"])
        if (site.code, site.offset, site.kind) not in seen:
            seen.add((site.code, site.offset, site.kind))
            with out.open("a") as f:
                f.write(json.dumps(said["site"]) + "\n")

    _exit_under(Probe("exit", said=found_at_exit), root / "collect-exit")
    return sites


def _exit_under(probe: Probe, folder: Path) -> None:
    """Record the exit scenario's program into ``folder``, and leave the probe on: the
    interpreter's real exit (threads' shutdown, then the exit hooks) runs under it. A hook
    registered before the session's runs after its hooks, and takes the probe off."""
    atexit.register(probe.__exit__, None, None, None)
    folder.mkdir(parents=True)
    Program(folder, "exit").after()
    probe.__enter__()


def load_sites(path: Path) -> list[Site]:
    return [Site(**json.loads(line)) for line in path.read_text().splitlines()]


def pairs(sites: list[Site]) -> list[tuple[Site, str]]:
    """The cases: each site with each kind of exception; a site of the exit with a Ctrl-C only
    (the exit runs once the stack has unwound: no RecursionError reaches it)."""
    return [(s, k) for s in sites for k in KINDS if s.scenario not in AT_EXIT or k == "interrupt"]


def exit_case(sites_file: Path, i: int, root: Path, results: Path) -> None:
    """Case ``i``, a site of the exit: a real exit interrupted at the site. Its result lines
    say whether the probe fired; the files say the rest."""
    site, kind = pairs(load_sites(sites_file))[i]
    f = results.open("a")

    def said(what: dict[str, Any]) -> None:
        f.write(json.dumps({"case": i, **what}) + "\n")
        f.flush()

    said({"folder": str(root / f"case-{i}"), "scenario": site.scenario, "site": site.name,
          "kind": kind, "via": site.via, "fired": False, "deferred": False})  # fmt: skip
    # The exit hangs: the stacks, and out. Well past the exit's own budget (exit_seconds(),
    # 5 s): a case takes 0.1 s of CPU but up to 14 s on 2 loaded cores (its fsyncs, the
    # interpreter's teardown); a lock left held waits for ever, and is still caught.
    faulthandler.dump_traceback_later(_EXIT_LIMIT, exit=True)
    _exit_under(Probe(site.scenario, site, KINDS[kind](), said=said), root / f"case-{i}")


def exit_cases(sites_file: Path, todo: list[int], root: Path, results: Path) -> None:
    """The exit's cases ``todo``, each in a child forked from here (no start-up to pay): the
    child sets the case up and leaves by the interpreter's real exit. A child that hangs past
    its watchdog is said in ``results`` with the stacks it dumped."""
    root.mkdir(parents=True, exist_ok=True)
    import mstx_marks.export  # noqa: F401  (here, once: each child would import it again)

    for i in todo:
        err = root / f"case-{i}.stderr"
        pid = os.fork()
        if pid == 0:
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            exit_case(sites_file, i, root, results)
            raise SystemExit(0)  # out of every frame: the interpreter's exit, for real
        deadline = time.monotonic() + _EXIT_LIMIT + 10
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            done = os.waitpid(pid, 0)
        text = err.read_text(errors="replace")
        if "Timeout (0:00:" in text or done[1] & 0x7F:
            stacks = [ln.strip() for ln in text.splitlines() if "mstx_marks/" in ln]
            hung = f"the exit hung (status {done[1]}); in the library: " + " | ".join(stacks[:8])
            with results.open("a") as f:
                f.write(json.dumps({"case": i, "hung": hung}) + "\n")


def cases(
    sites_file: Path, first: int, stop: int, root: Path, results: Path, limit: float = 5.0
) -> None:
    """Cases ``first`` .. ``stop - 1`` of (site, kind) pairs, one result line each; a "start"
    line before each, so that a case that hangs or kills the process is known."""
    todo = pairs(load_sites(sites_file))
    for scenario in SCENARIOS:  # as collect() did: the process's first ranges take other paths
        if scenario not in AT_EXIT:
            run_case(root / f"warm-{scenario}-{first}", scenario, None, None)
    with results.open("a") as f:
        for i in range(first, min(stop, len(todo))):
            site, kind = todo[i]
            if site.scenario in AT_EXIT:  # exit_case's, each in a process of its own
                continue
            f.write(json.dumps({"start": i}) + "\n")
            f.flush()
            with _watchdog(limit):
                r = run_case(root / f"case-{i}", site.scenario, site, kind)
            r.update(case=i, site=site.name, kind=kind, via=site.via)
            f.write(json.dumps(r) + "\n")
            f.flush()


def read(folders: list[str]) -> dict[str, Any]:
    """What a user reads in each folder: ``mstx-marks summary --json`` (its phase counts, notes
    and errors), the Chrome trace's complete events, and the spill's (for the symptom)."""
    from mstx_marks.cli.main import main
    from mstx_marks.export.spill import read_spill

    got: dict[str, Any] = {}
    for folder in folders:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code: object
            try:
                code = main(["summary", "--json", "--jobs", "1", folder])
            except SystemExit as stop:
                code = stop.code
        entry: dict[str, Any] = {"folder": folder, "rc": code, "stderr": err.getvalue()[-600:]}
        try:
            doc = json.loads(out.getvalue())
        except ValueError:
            doc = {}
        counts: dict[str, int] = {}
        totals: dict[str, int] = {}
        for phase in doc.get("phases", []):
            counts[phase["name"]] = counts.get(phase["name"], 0) + phase["all"]["count"]
            totals[phase["name"]] = totals.get(phase["name"], 0) + phase["all"]["total_ns"]
        entry["summary"], entry["total_ns"] = counts, totals
        entry["source"] = [r.get("source") for r in doc.get("ranks", {}).values()]
        entry["notes"] = doc.get("notes", [])
        chrome: dict[str, int] = {}
        for path in Path(folder).glob("chrome/*.trace.json"):
            try:
                events = json.loads(path.read_text())["traceEvents"]
            except (OSError, ValueError, KeyError) as exc:
                chrome["<unreadable>"] = 1
                entry["chrome_error"] = repr(exc)[:200]
                continue
            for e in events:
                if e.get("ph") == "X":
                    chrome[e["name"]] = chrome.get(e["name"], 0) + 1
                    # open: still running when the files were written, ended there
                    kind = "open" if (e.get("args") or {}).get("open") else "ended"
                    kept = entry.setdefault(f"{kind}_us", {})
                    kept[e["name"]] = kept.get(e["name"], 0.0) + e["dur"]
                    if kind == "open":
                        entry.setdefault("open", []).append(e["name"])
        entry["chrome"] = chrome if list(Path(folder).glob("chrome/*.trace.json")) else None
        spill: dict[str, int] = {}
        for path in Path(folder).glob("spill/*.jsonl"):
            try:
                for r in read_spill(path).ranges:
                    spill[r.name] = spill.get(r.name, 0) + 1
            except (OSError, ValueError) as exc:
                entry["spill_error"] = repr(exc)[:200]
        entry["spill"] = spill
        got[folder] = entry
    return got


def symptom(scenario: str, files: dict[str, Any]) -> tuple[str, str] | None:
    """What is wrong in a case's files (None: nothing), as (the kind of wrong, to group cases
    by; the counts): a range count out of its bounds in the summary or the Chrome trace."""
    kinds, counts = [], []
    for name, (least, most) in EXPECTED[scenario].items():
        for view in ("summary", "chrome"):
            got = files.get(view)
            n = None if got is None else got.get(name, 0)
            if n is None and view == "chrome" and scenario in AT_EXIT:
                continue
            if n is None:
                kinds.append(f"no {view}")
            elif not least <= n <= most:
                kinds.append(f"{view} {'lacks' if n < least else 'repeats'} {name}")
                counts.append(f"{view} {n} {name} (spill {files['spill'].get(name, 0)})")
    if files.get("rc") not in (0, None):
        error = files["stderr"].replace(str(files.get("folder", "")), "OUT").strip()
        kinds.append(f"summary exits {files['rc']}: {error.splitlines()[-1][:160]}")
    if not kinds:
        return None
    return ", ".join(dict.fromkeys(kinds)), ", ".join(counts)


# --- signals from a timer, recursion at the limit --------------------------------------------


class Timeout(Exception):
    """A reward function's SIGALRM timeout."""


def itimer(folder: Path, seconds: float) -> dict[str, Any]:
    """Record for ``seconds`` while a 0.2 ms timer's handler raises :class:`Timeout` whenever a
    library frame is on top of the stack (and does nothing otherwise); every Timeout must reach
    the loop, which carries on; then 1,000 ranges more, and the exit. Says where each Timeout
    that never reached the loop was raised."""
    from mstx_marks import instant, mark
    from mstx_marks.export import flush_at_exit

    flush_at_exit(folder)
    raised: list[tuple[Timeout, str]] = []  # kept alive: their ids stay theirs
    reached: set[int] = set()
    shared = mark("shared")
    lib = str(PACKAGE)

    def handler(signum: int, frame: FrameType | None) -> None:
        top = sys._getframe(1)
        if top.f_code.co_filename.startswith(lib):
            exc = Timeout(len(raised))
            raised.append((exc, f"{_where(top.f_code)}:{top.f_lineno}"))
            raise exc

    def work() -> int:  # the user's own code between ranges
        return sum(range(4000))

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
    began = time.monotonic()
    deadline = began + seconds
    i = completed = cycles = 0
    try:
        while time.monotonic() < deadline:
            i += 1
            try:
                with shared, mark(f"storm_{i % 300}"):  # new names too: the name table's path
                    instant("tick")
                    work()
                completed += 1
            except Timeout as exc:
                seen: BaseException | None = exc
                chain: set[int] = set()
                while seen is not None:  # one raised while the library handled another
                    if id(seen) in chain:
                        cycles += 1  # a loop over __context__ would walk it for ever
                        break
                    chain.add(id(seen))
                    if isinstance(seen, Timeout):
                        reached.add(id(seen))
                    seen = seen.__context__
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    elapsed_ns = int((time.monotonic() - began) * 1e9)
    for _ in range(1000):
        with mark("later"):
            pass
    faults = dict(mstx_marks.status().faults)
    atexit._run_exitfuncs()
    lost: dict[str, int] = {}
    for timeout, where in raised:
        if id(timeout) not in reached:
            lost[where] = lost.get(where, 0) + 1
    return {"raised": len(raised), "reached": len(reached), "loops": i, "completed": completed,
            "swallowed_at": lost, "elapsed_ns": elapsed_ns, "faults": faults,
            "cycles": cycles}  # fmt: skip


def recursion(folder: Path, offsets: int) -> dict[str, Any]:
    """For depths near the recursion limit, each of the last ``offsets`` below it: recurse and,
    at the bottom, enter a ``mark`` first used there (``deep_<k>``), a shared Mark twice
    (``shared_deep``), a decorated call (``decorated_deep``). Every RecursionError must reach
    the top; a bottom that completed must have its ranges recorded (a RecursionError taken for
    a backend's fault would complete without them). Then 100 ranges more, and the exit."""
    import mstx_marks
    from mstx_marks import mark, mstx_range
    from mstx_marks.export import flush_at_exit

    flush_at_exit(folder)
    shared = mark("shared_deep")
    decorated = mstx_range("decorated_deep")(lambda: None)
    errors: dict[str, int] = {}
    completed: dict[str, int] = {}
    other: list[str] = []

    def down(n: int, at_bottom: Callable[[], None]) -> None:
        if n > 0:
            down(n - 1, at_bottom)
        else:
            at_bottom()

    def fresh_name(k: int) -> Callable[[], None]:
        def bottom() -> None:
            with mark(f"deep_{k}"):
                pass

        return bottom

    def with_shared() -> None:
        with shared, shared:
            pass

    depth = len(traceback.extract_stack())
    limit = sys.getrecursionlimit()
    for k in range(offsets):
        for what, bottom in (("deep", fresh_name(k)), ("shared_deep", with_shared),
                             ("decorated_deep", decorated)):  # fmt: skip
            try:
                down(limit - depth - k, bottom)
                completed[what] = completed.get(what, 0) + 1
            except RecursionError:
                errors[what] = errors.get(what, 0) + 1
            except BaseException as exc:  # anything else is not the user's
                other.append(f"{type(exc).__name__}: {exc}"[:200])
    for _ in range(100):
        with mark("later"):
            pass
    faults = dict(mstx_marks.status().faults)
    atexit._run_exitfuncs()
    return {"errors": errors, "completed": completed, "other": other, "faults": faults}


def main(argv: list[str]) -> None:
    mode, *args = argv
    if mode == "collect":
        collect(Path(args[0]), Path(args[1]))
    elif mode == "cases":
        cases(Path(args[0]), int(args[1]), int(args[2]), Path(args[3]), Path(args[4]),
              float(args[5]))  # fmt: skip
    elif mode == "exitcases":
        todo = [int(k) for k in args[1].split(",") if k]
        exit_cases(Path(args[0]), todo, Path(args[2]), Path(args[3]))
    elif mode == "read":
        print(json.dumps(read(json.loads(Path(args[0]).read_text()))))
    elif mode == "itimer":
        with _watchdog(60):
            print(json.dumps(itimer(Path(args[0]), float(args[1]))))
    elif mode == "recursion":
        with _watchdog(60):
            print(json.dumps(recursion(Path(args[0]), int(args[1]))))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
