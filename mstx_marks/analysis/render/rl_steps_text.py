"""The per-step model (:mod:`mstx_marks.analysis.model.rl_steps`) as ``summary`` prints it: a table
of
step x role x rank (busy, idle, top phases), a critical-path line per step, what the step
would take if its slowest rank matched the median and its rollout long tail (the slowest
engine against the median, each engine's decode steps and tokens); and as JSON (every step,
every process).

The table shows at most :data:`MAX_SHOWN_STEPS` steps (the longest, in step order) and, per
role and step, at most :data:`MAX_RANK_ROWS` ranks (else the busiest and the least busy); the
JSON holds every one.

>>> from mstx_marks.analysis.model.rl_steps import analyse
>>> from mstx_marks.analysis.model.spans import ProcessSpans
>>> from mstx_marks.analysis.model.steps import Step
>>> from mstx_marks.base.records import Member
>>> t = ProcessSpans(); t.add(0, 4 * 10**6, "gen"); t.set_steps([Step(0, 5 * 10**6, "1", 0)])
>>> w = ProcessSpans(); w.add(10**6, 3 * 10**6, "update_actor")
>>> model = analyse([(Member("trainer", 0), t.finish()), (Member("worker", 0), w.finish())])
>>> print("\\n".join(format_steps(model)[2:5]))
step  length ms  role    rank    busy ms    idle ms  top phases (ms)
1         5.000  trainer    0      4.000      1.000  gen 4.000
                 worker     0      2.000      3.000  update_actor 2.000
"""

from __future__ import annotations

import json
from typing import IO, Any

from mstx_marks.analysis.model.clocks import MachineClock
from mstx_marks.analysis.model.rl_steps import (
    EngineStep,
    ProcessSteps,
    RolloutTail,
    StepAnalysis,
    StepInfo,
)

__all__ = ["MAX_RANK_ROWS", "MAX_SHOWN_STEPS", "format_steps", "steps_json", "write_json"]

#: The table shows at most this many steps: the longest, in step order.
MAX_SHOWN_STEPS = 10
#: Per role and step, the table shows at most this many ranks: else the busiest and the least.
MAX_RANK_ROWS = 8
#: Phases shown per row, and the widest a phase name is shown.
_TOP = 3
_NAME_WIDTH = 40


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _name(text: str, width: int = _NAME_WIDTH) -> str:
    shown = text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)
    return shown if len(shown) <= width else shown[: width - 3] + "..."


def _shown_steps(model: StepAnalysis) -> list[int]:
    n = len(model.steps)
    if n <= MAX_SHOWN_STEPS:
        return list(range(n))
    longest = sorted(range(n), key=lambda i: (-model.steps[i].length_ns, i))
    return sorted(longest[:MAX_SHOWN_STEPS])


def _rows_of_step(model: StepAnalysis, i: int) -> list[tuple[ProcessSteps, str]]:
    """The rows of step ``i``: every process with figures there, by role and rank, a role of
    many ranks cut to its busiest and least busy (with a line saying how many more)."""
    out: list[tuple[ProcessSteps, str]] = []
    for role in model.roles():
        here = [p for p in model.processes if p.member.role == role and p.present(i)]
        if len(here) > MAX_RANK_ROWS:
            by_busy = sorted(here, key=lambda p: (-p.busy_ns[i], p.member.rank))
            out += [(by_busy[0], "busiest"), (by_busy[-1], "least busy")]
            more = f"... {len(here) - 2} more ranks" + (f" of {_name(role)}" if role else "")
            out.append((by_busy[0], more))
        else:
            out += [(p, "") for p in here]
    return out


#: The critical path's phases a line shows at most (the JSON holds them all).
MAX_PATH_LINKS = 12


def _path_line(step: StepInfo) -> str:
    links = []
    for link in step.path:
        text = f"{_name(link.phase)} {_ms(link.time_ns)}"
        if link.waited is not None:
            text += f" (last: {_name(link.waited.label)} {_name(link.waited_phase)})"
        links.append(text)
    if len(links) > MAX_PATH_LINKS:  # a loop of thousands of phases: its head and its end
        cut = len(links) - MAX_PATH_LINKS + 1
        links = [
            *links[: MAX_PATH_LINKS // 2],
            f"... {cut} more",
            *links[-(MAX_PATH_LINKS // 2 - 1) :],
        ]
    return "  critical path: " + (" > ".join(links) if links else "no phase of the reference")


def _what_if_line(step: StepInfo) -> str | None:
    w = step.what_if
    if w is None:
        return None
    role = f"{_name(w.role)} " if w.role else ""
    return (
        f"  if the slowest rank matched the median: {_ms(w.step_ns)} ms, {_ms(w.saving_ns)} less"
        f" ({role}{_name(w.phase)}: rank {w.slowest_rank} {_ms(w.slowest_ns)} vs median"
        f" {_ms(w.median_ns)})"
    )


def _tail_line(step: StepInfo) -> str | None:
    t = step.tail
    if t is None:
        return None
    shown = t.engines[:MAX_RANK_ROWS]
    more = f" (first {len(shown)} of {len(t.engines)})" if len(shown) < len(t.engines) else ""

    def tokens(e: EngineStep) -> str:
        return "not known" if e.tokens is None else str(e.tokens)

    n = len(t.engines)
    return (
        f"  rollout long tail: {n} engine{'s' * (n != 1)}, slowest {_name(t.slowest.label)}"
        f" {_ms(t.slowest_ns)} ms vs median {_ms(t.median_ns)} ms"
        f" ({t.waiting_share * 100:.0f} % of the rollout waiting for it); decode steps"
        f"{more} "
        + "/".join(str(e.decode_steps) for e in shown)
        + ", tokens "
        + "/".join(tokens(e) for e in shown)
    )


def format_steps(model: StepAnalysis) -> list[str]:
    """The per-step section of ``summary``'s table, as lines."""
    shown = _shown_steps(model)
    roles = [_name(p.member.role) or "-" for p in model.processes]
    rw = max([len("role"), *(len(r) for r in roles)])
    kw = max([len("step"), *(len(_name(model.steps[i].key, 12)) for i in shown)])
    lines = [
        f"per step: steps of {_name(model.reference.label)} ({model.total_steps} in all"
        + (f", every {model.every}th analysed" if model.every > 1 else "")
        + "); idle = the step's time the process ran no phase",
        f"clocks: {model.clock.text()}",
        f"{'step':<{kw}} {'length ms':>10}  {'role':<{rw}} {'rank':>4} {'busy ms':>10} "
        f"{'idle ms':>10}  top phases (ms)",
    ]
    for i in shown:
        step = model.steps[i]
        first = True
        for p, label in _rows_of_step(model, i):
            if label.startswith("..."):
                lines.append(f"{'':<{kw}} {'':>10}  {label}")
                continue
            head = f"{_name(step.key, 12):<{kw}} {_ms(step.length_ns):>10}" if first else ""
            first = False
            length = p.length_ns[i]
            busy = _ms(p.busy_ns[i]) + (f" ±{_ms(p.uncertain_ns[i])}" if p.uncertain_ns[i] else "")
            top = ", ".join(f"{_name(n)} {_ms(t)}" for n, t in p.top_phases(i, _TOP))
            extra = []
            if p.member.process:  # (one of several processes of its role and rank at once)
                extra.append(p.member.process)
            if length != step.length_ns:  # its own step (an SPMD rank)
                extra.append(f"own step {_ms(length)} ms")
            if label:
                extra.append(label)
            role = _name(p.member.role) or "-"
            lines.append(
                f"{head:<{kw + 11}}  {role:<{rw}} {p.member.rank:>4} {busy:>10} "
                f"{_ms(p.idle_ns(i)):>10}  {top}" + (f" ({'; '.join(extra)})" if extra else "")
            )
        lines.append(_path_line(step))
        what_if = _what_if_line(step)
        if what_if:
            lines.append(what_if)
        tail = _tail_line(step)
        if tail:
            lines.append(tail)
    if len(shown) < len(model.steps):
        lines.append(
            f"({len(model.steps) - len(shown)} other steps: the {MAX_SHOWN_STEPS} longest are"
            " shown; --json holds every one)"
        )
    split = model.split
    lines.append(
        f"{split} phase span{'s' * (split != 1)} crossed a step's edge and"
        f" {'were' if split != 1 else 'was'} split between the steps"
    )
    lines += [f"note: {n}" for n in model.notes]
    return lines


def _member(m: Any) -> dict[str, Any] | None:
    if m is None:
        return None
    process = {"process": m.process} if m.process else {}  # (one of several at once)
    return {"role": m.role, "rank": m.rank, **process, "key": m.key}


def _machine(m: MachineClock) -> dict[str, Any]:
    """A machine's clock (``offset_ns``: how far ahead of the reference's, as applied;
    ``low_ns``/``high_ns`` the bounds measured, None: unbounded; ``bound_ns`` how far the
    applied offset may be off, None: not bounded; ``pairs`` the nested calls and
    ``round_trips`` the clock actor's exchanges that bound it)."""
    return {
        "name": m.name, "hosts": m.hosts, "boot_id": m.boot_id, "status": m.status,
        "offset_ns": m.offset_ns, "low_ns": m.low_ns, "high_ns": m.high_ns,
        "bound_ns": m.bound_ns, "pairs": m.pairs, "round_trips": m.round_trips,
        "conflicts": m.conflicts,
        "processes": [x.key for x in m.members],
    }  # fmt: skip


def _tail_json(t: RolloutTail | None) -> dict[str, Any] | None:
    """A step's rollout long tail (``tokens``/``reqs`` None: not known)."""
    if t is None:
        return None
    return {
        "slowest": _member(t.slowest),
        "slowest_ns": t.slowest_ns,
        "median_ns": t.median_ns,
        "waiting_share": t.waiting_share,
        "engines": [
            {**(_member(e.member) or {}), **{k: v for k, v in vars(e).items() if k != "member"}}
            for e in t.engines
        ],
    }


def steps_json(model: StepAnalysis) -> dict[str, Any]:
    """The per-step model as plain JSON data (nanoseconds; ``-1`` where a process has no
    figures for a step). Per process, each list holds one value per step of ``steps``.

    >>> from mstx_marks.analysis.model.rl_steps import analyse
    >>> from mstx_marks.analysis.model.spans import ProcessSpans
    >>> from mstx_marks.analysis.model.steps import Step
    >>> from mstx_marks.base.records import Member
    >>> t = ProcessSpans(); t.add(0, 30, "gen"); t.set_steps([Step(0, 50, "7", 50)])
    >>> doc = steps_json(analyse([(Member("trainer", 0), t.finish())]))
    >>> doc["steps"][0]["key"], doc["processes"][0]["busy_ns"], doc["processes"][0]["idle_ns"]
    ('7', [30], [20])
    """
    return {
        "reference": _member(model.reference),
        "loop_role": model.loop_role,
        "total_steps": model.total_steps,
        "every": model.every,
        "clock": {
            "aligned_by": model.clock.aligned_by,
            "hosts": model.clock.hosts,
            "unknown_host": [m.key for m in model.clock.unknown],
            "shifts_ns": {m.key: v for m, v in sorted(model.clock.shifts_ns.items())},
            "machines": [_machine(m) for m in model.clock.machines],
            "accuracy": model.clock.text(),
        },
        "steps": [
            {
                "key": s.key,
                "start_ns": s.start_ns,
                "end_ns": s.end_ns,
                "length_ns": s.length_ns,
                "critical_path": [
                    {
                        "phase": link.phase,
                        "start_ns": link.start_ns,
                        "end_ns": link.end_ns,
                        "time_ns": link.time_ns,
                        "waited": None
                        if link.waited is None
                        else {
                            **(_member(link.waited) or {}),
                            "phase": link.waited_phase,
                            "end_ns": link.waited_end_ns,
                        },
                    }
                    for link in s.path
                ],
                "what_if": None if s.what_if is None else vars(s.what_if),
                "rollout_tail": _tail_json(s.tail),
            }
            for s in model.steps
        ],
        "processes": [
            {
                **(_member(p.member) or {}),
                "host": p.host,
                "own_steps": p.own,
                "length_ns": list(p.length_ns),
                "busy_ns": list(p.busy_ns),
                "idle_ns": [p.idle_ns(i) for i in range(len(p.length_ns))],
                "uncertain_ns": list(p.uncertain_ns),
                "phases": {name: list(v) for name, v in p.phases.items()},
                "split": p.split,
                "outside_ns": p.outside_ns,
                "slack_ns": p.slack_ns,
            }
            for p in model.processes
        ],
        "split": model.split,
        "notes": model.notes,
    }


def write_json(doc: dict[str, Any], out: IO[str]) -> None:
    """``json.dump(doc, out, indent=1)`` and a newline, but with each step and process of its
    ``per_step`` part (:func:`steps_json`) on one line: the same data, written at the JSON
    module's C speed (the indented encoder is pure Python: seconds for a table of many steps).

    >>> import io
    >>> out = io.StringIO()
    >>> write_json({"roles": [], "per_step": {"steps": [{"key": "1"}], "split": 0}}, out)
    >>> json.loads(out.getvalue())["per_step"]["steps"], out.getvalue().count("\\n")
    ([{'key': '1'}], 9)
    """
    per_step = doc.get("per_step")
    rest = {k: v for k, v in doc.items() if k != "per_step"}
    if not per_step or not rest:  # (one write: json.dump writes each token on its own)
        out.write(json.dumps(doc, indent=1) + "\n")
        return
    text = json.dumps(rest, indent=1)
    out.write(text[: -len("\n}")] + ',\n "per_step": {')
    for n, (key, value) in enumerate(per_step.items()):
        out.write(("," if n else "") + f"\n  {json.dumps(key)}: ")
        if key in ("steps", "processes") and value:
            out.write("[\n   " + ",\n   ".join(json.dumps(v) for v in value) + "\n  ]")
        else:
            out.write(json.dumps(value))
    out.write("\n }\n}\n")
