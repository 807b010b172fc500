"""A trainer's live step figures: every process's spill followed in a background thread, each
step analysed by ``summary``'s own code once every process has written past its end, and the
figures handed to the trainer's next log call.

**What it reads.** Every process of the job spills its events under ``MSTX_MARKS_OUT`` (its
writer thread, every half second: :mod:`mstx_marks.export.out`). :class:`LiveSteps` makes
``<out>/live/``, from which on each process's writer also says, after each spill, how far its
spill is written and which ranges are open (a *beat*: :mod:`mstx_marks.export.live_beat`). A
background thread follows every spill of this run (:class:`~mstx_marks.export.spill_tail.
SpillWindow`: the lines appended since it last looked) and every beat.

**When a step is complete.** The trainer's log call for step ``S`` (one with ``timing_s/step``:
verl's, right after its ``step`` timer) is made at ``t``, after the step ended. The step's
figures are complete once every process has a beat past ``t`` (all it recorded before is in its
spill; what is open then is in the beat) and :data:`SETTLE_S` has passed (a process started
during the step has beaten by then); a process whose spill is finished (it ended well) needs
none. A process heard of during the step but not past its end is *left out* of it: its figures
there are not known (killed, stopped, or slow). One silent since before the step (gone: a
process killed earlier) had nothing in it, and stays, idle, as the files show it; the thread
waits for a process only until nothing new came from it for ``gone_s``. The figures are made by
``summary``'s code (:func:`~mstx_marks.analysis.summary.summarize_path`) on what the spills hold
from a little before the step on, each spill's lines written as a spill of its own in a scratch
folder (the beat's open ranges added, as open then): the per-step model of the job's files, the
same one ``mstx-marks summary --json`` prints afterwards
(:mod:`mstx_marks.analysis.model.rl_steps`),
and :func:`~mstx_marks.live.figures.step_figures` of its step whose end is the latest before
``t``.

**When they are logged.** At a log call, the figures of every earlier step that are complete go
with it (``mstx/step`` says which step they describe), and so do those made of a step whose
next log call this is: made with the processes that had written past it, the others left out
(``mstx/left_out``; a warning names them). So a step is logged at the latest one step late when
the next step's call comes after :data:`SETTLE_S` (RL steps take seconds to minutes); a
shorter step's figures are not made by then and go with the first call after they are. The
log call only takes what the thread made: it never waits (:attr:`LiveSteps.hold_ns`,
``mstx/live/hold_ms``). The trainer's last step goes when its ``fit`` ends or its logger's
``finish`` is called (:mod:`mstx_marks.capture.live_slot`), which waits for it at most
``finish_s``.
Older figures than the call's own go in calls of their own, at the call's step (W&B takes
only the current or a later step).

**Bounds.** Each spill keeps its lines from a second before the last step whose figures are
made (:meth:`~mstx_marks.export.spill_tail.SpillWindow.forget_before`); a step is analysed once
when complete, and again only when more processes caught up.

**Where it holds.** Processes whose spills this process sees: on one machine, all; across
machines, ``MSTX_MARKS_OUT`` must be one shared folder (``mstx/processes`` says how many were
seen). The figures equal ``summary``'s of the job's files for the same step, but where a
process held more ranges than are kept exactly (the summary's ``uncertain_ns``): then the live
ones, from fewer ranges, are the exact ones.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mstx_marks.backends.record import now_ns
from mstx_marks.base import env
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.records import TraceFileError
from mstx_marks.export.live_beat import BEAT_SUFFIX, LIVE_FOLDER, read_beat
from mstx_marks.export.spill import SPILL_SUFFIX
from mstx_marks.export.spill_tail import SpillWindow
from mstx_marks.live.figures import PREFIX

__all__ = ["SETTLE_S", "LiveSteps", "StepCall"]

#: After a step's log call, how long a process started during the step may take to say so.
SETTLE_S = 1.0
#: Clocks of one machine's processes agree to microseconds; what a comparison allows.
_SLACK_NS = 50_000_000
#: What a spill keeps before the last step made: clocks of machines agree to milliseconds.
_KEEP_NS = 1_000_000_000
#: What marks a log call of one step (verl's ``compute_timing_metrics`` of its ``step`` timer).
STEP_KEY = "timing_s/step"


@dataclass
class StepCall:
    """One training step's log call, and what was made of it."""

    step: int
    at_ns: int
    figures: dict[str, float] | None = None
    complete: bool = False
    left_out: list[str] = field(default_factory=list)
    delivered: bool = False
    #: How many processes had caught up when its figures were made.
    caught: int = -1


@dataclass
class _Process:
    window: SpillWindow | None = None
    beat: dict[str, Any] | None = None
    #: When (this process's monotonic clock) something new last came from it.
    heard: float = field(default_factory=time.monotonic)
    ignored: bool = False

    def label(self, name: str) -> str:
        header = self.window.header if self.window is not None else None
        if header:
            role, rank = header.get("role") or "?", header.get("rank", 0)
            return f"{role} rank {rank} (pid {header.get('pid')})"
        return name


class LiveSteps:
    """The live figures of the job writing under ``out_dir``, for one trainer's logger (see the
    module's docstring): :meth:`log` at each log call, :meth:`finish` at the end.

    >>> import tempfile
    >>> live = LiveSteps(tempfile.mkdtemp(), poll_s=0.05)
    >>> calls = live.log({"timing_s/step": 1.0}, 1)
    >>> [sorted(d) for d, _ in calls]  # nothing ready yet: the call as it was, and its hold
    [['mstx/live/hold_ms', 'timing_s/step']]
    >>> live.close()
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        run: str | None = None,
        poll_s: float = 0.25,
        settle_s: float = SETTLE_S,
        gone_s: float = 10.0,
        finish_s: float = 10.0,
    ) -> None:
        self.out = Path(out_dir)
        self.run = run or env.run_id()
        self.poll_s, self.settle_s, self.gone_s, self.finish_s = poll_s, settle_s, gone_s, finish_s
        (self.out / LIVE_FOLDER).mkdir(parents=True, exist_ok=True)  # (the processes beat now)
        self.calls: list[StepCall] = []
        #: The longest a log call was held here, in ns.
        self.hold_ns = 0
        self._processes: dict[str, _Process] = {}
        self._lock = threading.Lock()  # (held to hand calls over, never while working)
        self._wake = threading.Event()
        self._done = threading.Event()
        self._changed = threading.Condition(self._lock)
        self._scratch = Path(tempfile.mkdtemp(prefix="mstx_marks-live-"))
        self._made = 0
        self._thread = threading.Thread(target=self._run, name="mstx_marks live", daemon=True)
        self._thread.start()

    # -- the trainer's side: never waits -------------------------------------------------------

    def log(self, data: dict[str, Any], step: int) -> list[tuple[dict[str, Any], int]]:
        """The log calls to make for ``log(data, step)``: ``data`` with the figures ready (the
        newest step's), after a call of their own for each older step's."""
        began = time.perf_counter_ns()
        training = STEP_KEY in data
        with self._lock:
            ready = [
                c
                for c in self.calls
                if not c.delivered and c.figures is not None and (c.complete or training)
            ]
            for c in ready:
                c.delivered = True
            if training:
                self.calls.append(StepCall(step, now_ns()))
        # (the thread is not woken: its work then would take the GIL from this very call)
        out = [(dict(c.figures or {}), step) for c in ready]
        self._say_left_out(ready)
        held = time.perf_counter_ns() - began
        self.hold_ns = max(self.hold_ns, held)
        newest = out.pop()[0] if out else {}
        newest[f"{PREFIX}/live/hold_ms"] = held / 1e6
        return [*out, ({**data, **newest}, step)]

    def finish(self) -> list[tuple[dict[str, Any], int]]:
        """The calls for the figures not logged yet, at the last step's number: waits at most
        ``finish_s`` for them to be complete (not at interpreter shutdown); then stops."""
        deadline = time.monotonic() + (0.0 if sys.is_finalizing() else self.finish_s)
        with self._changed:
            while time.monotonic() < deadline and not all(
                c.complete or c.delivered for c in self.calls
            ):
                self._wake.set()
                self._changed.wait(min(self.poll_s, max(deadline - time.monotonic(), 0.0)))
            ready = [c for c in self.calls if not c.delivered and c.figures is not None]
            for c in ready:
                c.delivered = True
            last = self.calls[-1].step if self.calls else 0
        self._say_left_out(ready)
        missing = [c.step for c in self.calls if c.figures is None]
        if missing:
            warn_once(
                ("live", "missing", id(self)),
                f"no live figures for step(s) {missing}: not made within {self.finish_s:g} s",
            )
        self.close()
        return [(dict(c.figures or {}), last) for c in ready]

    def close(self) -> None:
        """Stop the thread and remove the scratch folder."""
        self._done.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        shutil.rmtree(self._scratch, ignore_errors=True)

    def _say_left_out(self, calls: list[StepCall]) -> None:
        for c in calls:
            if c.left_out:
                warn_once(
                    ("live", "left out", id(self), c.step),
                    f"step {c.step}'s live figures leave out {', '.join(c.left_out)}: no word"
                    " from them past the step's end in time (slow, stopped or killed)",
                )

    # -- the thread's side -----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._done.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._done.is_set():
                return
            try:
                self._refresh()
            except Exception as exc:  # the figures are a bonus: never the trainer's problem
                warn_once(("live", "refresh", type(exc).__name__), f"live figures: {exc!r}")

    def _refresh(self) -> None:
        self._read_beats()
        self._follow_spills()
        with self._lock:
            pending = [c for c in self.calls if not c.complete and not c.delivered]
        for c in pending:
            if now_ns() < c.at_ns + self.settle_s * 1e9:
                break
            before = self._before(c)
            left_out = self._left_out(c.at_ns, before)
            waiting = [n for n in left_out if n in self._expected()]
            caught = len(self._processes) - len(left_out)
            if waiting and caught == c.caught:
                continue  # nothing new to make it from
            figures = self._make(c, left_out)
            with self._changed:
                c.figures, c.complete, c.caught = figures, not waiting, caught
                c.left_out = [self._processes[n].label(n) for n in left_out]
                self._changed.notify_all()
        self._forget()

    def _read_beats(self) -> None:
        try:
            entries = list(os.scandir(self.out / LIVE_FOLDER))
        except OSError:
            return
        for entry in entries:
            if not entry.name.endswith(BEAT_SUFFIX) or entry.name.startswith("."):
                continue
            beat = read_beat(entry.path)
            if beat is None or beat.get("run") != self.run:
                continue
            p = self._processes.setdefault(beat["spill"], _Process())
            if p.beat is None or p.beat["through_ns"] != beat["through_ns"]:
                p.beat, p.heard = beat, time.monotonic()

    def _follow_spills(self) -> None:
        try:
            entries = list(os.scandir(self.out / "spill"))
        except OSError:
            return
        for entry in entries:
            if not entry.name.endswith(SPILL_SUFFIX):
                continue
            p = self._processes.setdefault(entry.name, _Process())
            if p.ignored:
                continue
            if p.window is None:
                p.window = SpillWindow(entry.path)
            try:
                if p.window.follow():
                    p.heard = time.monotonic()
            except TraceFileError:
                p.ignored = True
                continue
            header = p.window.header
            if header is not None and header.get("run") != self.run:
                p.ignored, p.window = True, None  # another run's: summary reads the newest only

    def _expected(self) -> list[str]:
        """The processes whose word a step waits for: not ended well, not gone."""
        now = time.monotonic()
        return [
            name
            for name, p in self._processes.items()
            if not p.ignored
            and not (p.window is not None and p.window.complete)
            and now - p.heard < self.gone_s
        ]

    def _before(self, call: StepCall) -> int:
        """When the step of ``call`` began at the earliest: the log call before it."""
        with self._lock:
            earlier = [c.at_ns for c in self.calls if c.at_ns < call.at_ns]
        return max(earlier, default=0)

    def _left_out(self, at_ns: int, since_ns: int) -> list[str]:
        """The processes whose figures in the step that ended by ``at_ns`` are not known: not
        ended well, no beat past ``at_ns``, and heard of since ``since_ns`` (one silent since
        before the step had nothing in it: it stays, as the files show it)."""
        out = []
        for name, p in self._processes.items():
            if p.ignored or (p.window is not None and p.window.complete):
                continue
            through = p.beat["through_ns"] if p.beat is not None else None
            if through is not None and through >= at_ns + _SLACK_NS:
                continue
            if through is None or through >= since_ns:
                out.append(name)
        return out

    def _make(self, call: StepCall, leave_out: list[str]) -> dict[str, float] | None:
        """The figures of ``call``'s step from what the spills hold, ``leave_out`` left out."""
        from mstx_marks.analysis.render.rl_steps_text import steps_json
        from mstx_marks.analysis.summary import summarize_path
        from mstx_marks.live.figures import step_figures

        self._made += 1
        folder = self._scratch / str(self._made)
        for name, p in self._processes.items():
            if p.ignored or p.window is None or p.window.header is None or name in leave_out:
                continue
            beat = p.beat if not p.window.complete else None
            opens = beat["opens"] if beat else []
            p.window.write(folder, opens, beat["through_ns"] if beat else 0)
        try:
            summary = summarize_path(folder, jobs=1, progress=False)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if summary.per_step is None:
            return None
        per_step = steps_json(summary.per_step)
        ends = [
            (s["end_ns"], i)
            for i, s in enumerate(per_step["steps"])
            if s["end_ns"] <= call.at_ns + _SLACK_NS
        ]
        if not ends:
            return None
        figures = step_figures(per_step, max(ends)[1])
        figures[f"{PREFIX}/step"] = call.step
        figures[f"{PREFIX}/left_out"] = len(leave_out)
        return figures

    def _forget(self) -> None:
        """Drop what no step still to make needs: lines ended a while before the last step
        whose figures are done (and every earlier one)."""
        with self._lock:
            done = 0
            for c in self.calls:
                if not (c.complete or c.delivered):
                    break
                done = c.at_ns
        if done:
            for p in self._processes.values():
                if p.window is not None:
                    p.window.forget_before(done - _KEEP_NS)
