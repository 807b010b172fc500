"""Contract: each process's finished spans in; its lane on the reference's clock, and why, out.

:func:`align` makes one lane per process placed on the reference's clock (a shift per lane)
and a :class:`ClockNote` saying how each clock was placed and how far to trust it. Pure:
nothing is read or written.

**A process** is (its machine's boot id, its pid, its instance): its own lane. Processes that
share a role and rank and ran at once (four engines that all say rank 0) are as many lanes,
told apart by their pid (``Member.process``); those that ran one after another (a restarted
worker) are one lane, each life placed by its own clock, and the restart is said.

**One machine, one clock.** Times are each process's monotonic clock plus its anchor (wall less
monotonic when it began). Processes that share a boot id (``/proc/sys/kernel/random/boot_id``)
share the monotonic clock, whatever their host names: they are moved onto one anchor (the
median of theirs), exactly. Without a boot id (an older file) the host name stands for the
machine, split where anchors lie more than :data:`ANCHORS_APART` apart (two machines of one
name: containers often are all ``localhost``); only as a fallback, since a large NTP step after
boot would otherwise split one machine in two.

**Machines.** Each machine's offset from the reference's (θ, how far its clock runs ahead) is
measured from calls one process blocks on while another does the work, as NTP measures from an
exchange: a call's range on the worker starts after the holder's range starts and ends before
it ends, so the pair bounds θ to ``[W.end - T.end, W.start - T.start]``. The pairs used: the
reference's ``generate_sequences``, ``compute_log_prob`` and ``update_actor`` against the same
phase of every process of another role, matched by order (:func:`match_calls`); and the rollout
a process blocks on (the reference's ``generate_sequences``, or that of a process of another
role that drives engines) against each engine's first and last model step of that rollout. A
source is trusted only as far as its pairs nest on the holder's own machine (θ = 0 there): each
side (starts, ends) separately, so an asynchronous rollout, started before the holder's range,
still bounds θ by its ends; a worker's call of a phase that no process of the holder's machine
ran is trusted unchecked (it is the body of the call the holder awaits) if no such call is
longer than the holder's, and said so (:func:`_trusted`). The intervals of one pair of machines
are intersected (Marzullo's algorithm, as NTP does); machines that meet only through a third
are chained as difference constraints (θ_b - θ_a in [lo, hi]). Then, per machine: both bounds,
the midpoint applied and the bound stated; one bound, the smallest shift that satisfies it,
said as "at least" (Jaeger's clock-skew adjuster); no pairs, nothing applied ("not measured");
pairs that contradict (no offset satisfies them all), nothing applied, the pairs named, drift
suspected. Time within the bound of a step's edge counts as uncertain (:func:`edge_doubt`).

**Round trips.** A process that exchanged clock readings with a peer (the Ray clock actor:
:class:`~mstx_marks.base.records.RoundTrip`) bounds its machine's θ against the peer's machine
by ``[sent - peer, received - peer]``, each on its machine's axis: causal by construction, so
trusted unchecked, and intersected with the nested calls of the same two machines. Round trips
that no one offset satisfies show a clock that moved over the job (drift, NTP's slewing): their
hull is then the bound and the movement is said; nested calls that disagree with round trips
are set aside (round trips are causal, a nesting is an assumption). A peer on a
machine where no process of the job recorded links the machines that measured against it
(chained as above, on its monotonic clock).

>>> from mstx_marks.analysis.model.spans import ProcessSpans
>>> from mstx_marks.analysis.model.steps import Step
>>> from mstx_marks.base.records import Origin
>>> t = ProcessSpans().identify(Origin("a", "boot-a", 0), [1], "")
>>> t.add(0, 100, "update_actor"); t.set_steps([Step(0, 200, "1", 200)])
>>> w = ProcessSpans().identify(Origin("b", "boot-b", 0), [2], "")
>>> w.add(1030, 1090, "update_actor")  # runs 1000 ahead: true [30, 90]
>>> v = ProcessSpans().identify(Origin("a", "boot-a", 0), [3], "")
>>> v.add(20, 95, "update_actor")  # on the trainer's machine: the phase nests, trusted
>>> trainer, worker = Member("trainer", 0), Member("worker", 1)
>>> procs = [(trainer, t.finish()), (worker, w.finish()), (Member("worker", 0), v.finish())]
>>> placed = align(procs, lambda lanes: ("trainer", trainer))
>>> b = placed.clock.machines[1]
>>> (b.status, b.low_ns, b.high_ns, b.offset_ns, placed.clock.shifts_ns[worker])
('measured', 990, 1030, 1010, -1010)
"""

from __future__ import annotations

import statistics
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from mstx_marks.analysis.model.batches import MODEL_STEPS, Batches
from mstx_marks.analysis.model.spans import ProcessSpans
from mstx_marks.base import phases
from mstx_marks.base.diagnostics import counted
from mstx_marks.base.records import Member, RoundTrip, Span

__all__ = [
    "ANCHORS_APART",
    "BLOCKING_PHASES",
    "Aligned",
    "ClockNote",
    "MachineClock",
    "align",
    "edge_doubt",
    "marzullo",
    "match_calls",
]

#: Without boot ids, processes of one host name whose anchors lie further apart than this are
#: taken to be on two machines (a clock set by NTP after boot moves an anchor by far less).
ANCHORS_APART = 60 * 10**9
#: The reference's calls that the job waits for, whose ranges hold the workers' of the same
#: phase (verl's synchronous stages).
BLOCKING_PHASES = (
    phases.GENERATE_SEQUENCES.name,
    phases.COMPUTE_LOG_PROB.name,
    phases.UPDATE_ACTOR.name,
)
#: The source of the pairs of a rollout and an engine's model steps inside it.
ROLLOUT = "rollout"
_ROLLOUT_PHASE = phases.GENERATE_SEQUENCES.name
#: Stand-ins for an unbounded side (no offset comes near: 146 years of nanoseconds).
_LOW, _HIGH = -(1 << 62), 1 << 62
#: How many contradicting pairs a note names.
_NAMED = 2

Bound = tuple[int, int]  # (low, high) of θ; _LOW / _HIGH where unbounded


def marzullo(intervals: Sequence[Bound]) -> tuple[int, int, int]:
    """The most intervals that share a point, and the smallest interval they all hold
    (Marzullo's algorithm, as NTP intersects its sources): ``(count, low, high)``; ``(0, 0,
    0)`` for none. Intervals that touch share their end point.

    >>> marzullo([(8, 12), (11, 13), (10, 12)])
    (3, 11, 12)
    >>> marzullo([(0, 1), (5, 6), (5, 9)])  # the first one is a falseticker
    (2, 5, 6)
    """
    edges = sorted([(lo, -1) for lo, _ in intervals] + [(hi, 1) for _, hi in intervals])
    best = count = 0
    low = high = 0
    for i, (value, kind) in enumerate(edges):
        count -= kind
        if count > best:
            best, low = count, value
            high = edges[i + 1][0]  # (the next edge is an end: count cannot rise further)
    return best, low, high


def match_calls(holder: Sequence[Span], held: Sequence[Span]) -> list[tuple[int, int]]:
    """Which of ``holder``'s calls each of ``held``'s is (``(holder index, held index)``), both
    in time order, each on its own clock: the same order, moved by the whole number of calls
    that puts the most pairs in agreement (Marzullo), ties to the smallest offset. Offset-free:
    a clock 250 ms ahead does not move a call into the next step's.

    >>> match_calls([(0, 10), (100, 110), (200, 210)], [(103, 108), (203, 209)])
    [(1, 0), (2, 1)]
    """
    if not holder or not held:
        return []
    near = bisect_right([s for s, _ in holder], held[0][0]) - 1
    candidates = {0, len(holder) - len(held), *range(near - 2, near + 3)}
    best: tuple[tuple[int, int], int] | None = None
    for c in sorted(candidates):
        ks = range(max(0, -c), min(len(held), len(holder) - c))
        if not ks:
            continue
        count, lo, hi = marzullo([_interval(holder[k + c], held[k]) for k in ks])
        score = (count, -abs(lo + hi))
        if best is None or score > best[0]:
            best = (score, c)
    if best is None:
        return []
    c = best[1]
    return [(k + c, k) for k in range(max(0, -c), min(len(held), len(holder) - c))]


def _interval(t: Span, w: Span, starts: bool = True, ends: bool = True) -> Bound:
    """θ's bounds from ``w`` nested in ``t`` (its starts' side, its ends' side)."""
    return (w[1] - t[1] if ends else _LOW, w[0] - t[0] if starts else _HIGH)


@dataclass
class MachineClock:
    """One machine's clock (its processes share it) and how it was placed on the reference's.

    ``status``: ``reference`` (the reference's machine), ``measured`` (both bounds: the
    midpoint applied), ``at least`` (one bound: the smallest shift satisfying it applied),
    ``not measured`` (no pair: nothing applied), ``contradicting`` (pairs no offset satisfies:
    nothing applied, ``conflicts`` names them; drift suspected). ``offset_ns`` is how far its
    clock runs ahead of the reference's, as applied; ``low_ns``/``high_ns`` the bounds the
    pairs give (None: unbounded); ``pairs`` how many nested calls gave them."""

    name: str
    hosts: list[str]
    boot_id: str
    members: list[Member]
    status: str = "not measured"
    offset_ns: int = 0
    low_ns: int | None = None
    high_ns: int | None = None
    pairs: int = 0
    conflicts: list[str] = field(default_factory=list)
    #: The sources of its pairs that could not be checked on the reference's machine.
    unchecked: list[str] = field(default_factory=list)
    #: How many clock round trips bound it (besides ``pairs``).
    round_trips: int = 0
    #: How far its offset moved over the job, as round trips that disagree show it (0: they
    #: agree); then their hull is the bound, and the nested calls are not used.
    drift_ns: int = 0
    #: Nested calls not used: they disagree with the round trips.
    set_aside: int = 0
    #: The anchor its processes are moved onto (None: none of them says one).
    anchor_ns: int | None = None

    @property
    def bound_ns(self) -> int | None:
        """How far the applied offset may be off: 0 on the reference's machine, half the
        bounds' width when measured, None when not bounded."""
        if self.status == "reference":
            return 0
        if self.status == "measured" and self.low_ns is not None and self.high_ns is not None:
            return -((self.low_ns - self.high_ns) // 2)
        return None

    def text(self) -> str:
        """This machine's line, in words.

        >>> MachineClock("b", ["b"], "", [], "measured", 2_500_000, 2_000_000, 3_000_000, 4).text()
        'b 2.500 ms ahead ±0.500 ms (measured from 4 nested calls, applied)'
        """
        if self.status == "reference":
            return f"{self.name} (the reference's)"
        if self.status == "measured":
            moved = (
                f"; the offset moved by {self.drift_ns / 1e6:.3f} ms over the job (drift), which"
                " the bound covers"
                if self.drift_ns
                else ""
            )
            if self.set_aside:
                moved += f"; {self.set_aside} nested calls that disagree with them set aside"
            return (
                f"{self.name} {_ahead(self.offset_ns)} ±{(self.bound_ns or 0) / 1e6:.3f} ms"
                f" (measured from {self._sources()}, applied{self._unchecked_said()}{moved})"
            )
        if self.status == "at least":
            if self.offset_ns:
                return (
                    f"{self.name} at least {_ahead(self.offset_ns)} (one-sided:"
                    f" {self._sources()} bound it on one side only; the smallest shift applied"
                    f"{self._unchecked_said()})"
                )
            bound = (
                f"at least {_ahead(self.low_ns)}"
                if self.low_ns is not None
                else f"at most {_ahead(self.high_ns or 0)}"
            )
            return (
                f"{self.name}: {bound} (one-sided: {self._sources()}), which its wall"
                " clock satisfies: not moved"
            )
        if self.status == "contradicting":
            return (
                f"{self.name}: pairs contradict, drift suspected, nothing applied"
                f" ({'; '.join(self.conflicts)})"
            )
        if self.round_trips:
            return (
                f"{self.name}: not measured (no nested calls; its round trips reach a clock no"
                " machine of the reference's chain measured), placed by its wall clock"
            )
        return f"{self.name}: not measured (no nested calls), placed by its wall clock"

    def _sources(self) -> str:
        """What bounds it: ``4 nested calls``, ``12 round trips`` or both."""
        said = [f"{self.pairs} nested calls"] if self.pairs or not self.round_trips else []
        if self.round_trips:
            said.append(
                f"{counted(self.round_trips, 'round trip', 'round trips')} to the clock actor"
            )
        return " and ".join(said)

    def _unchecked_said(self) -> str:
        if not self.unchecked:
            return ""
        return (
            f"; {'/'.join(self.unchecked)} unchecked, as no process of the reference's machine"
            " ran them"
        )


def _ahead(ns: int) -> str:
    return f"{abs(ns) / 1e6:.3f} ms {'ahead' if ns >= 0 else 'behind'}"


@dataclass
class ClockNote:
    """How the processes' clocks were put on one axis, and how far to trust it: ``hosts`` the
    hosts the files named, ``unknown`` the processes whose file names none (another tool's
    file: placed by the wall clock it holds), ``shifts_ns`` how far each lane was moved
    (only those moved), ``machines`` each machine's clock (the reference's first),
    ``bound_ns`` how far each lane's shift may be off (only lanes where it may), ``notes``
    what the reader should know (restarts, processes at once, clock steps, contradictions),
    ``pid_shifts_ns`` how far each process was moved, by (role, rank, pid) (only those moved:
    the lives of a lane each have their own; see :meth:`shift_of`)."""

    hosts: list[str]
    unknown: list[Member]
    shifts_ns: dict[Member, int] = field(default_factory=dict)
    machines: list[MachineClock] = field(default_factory=list)
    bound_ns: dict[Member, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    pid_shifts_ns: dict[tuple[str, int, int], int] = field(default_factory=dict)

    def shift_of(self, member: Member, pid: int) -> int:
        """How far a record of ``member``'s process ``pid`` was moved onto the aligned axis:
        what a picture of a trace that joins several processes (a restarted worker) moves
        each record by.

        >>> note = ClockNote([], [], pid_shifts_ns={("worker", 1, 7): -5})
        >>> note.shift_of(Member("worker", 1), 7), note.shift_of(Member("worker", 1), 8)
        (-5, 0)
        """
        key = (member.role, member.rank, pid)
        return self.pid_shifts_ns.get(key, self.shifts_ns.get(member, 0))

    @property
    def aligned_by(self) -> str:
        """``monotonic`` when every process is on one machine that says so; ``measured`` when
        every other machine's offset was measured (both bounds) from nested calls; ``wall``
        otherwise (some processes placed by their wall clocks)."""
        if self.unknown or not self.machines:
            return "wall"
        if len(self.machines) == 1:
            return "monotonic"
        others = self.machines[1:]
        return "measured" if all(m.status == "measured" for m in others) else "wall"

    def text(self) -> str:
        """The accuracy, in words.

        >>> print(ClockNote([], []).text())
        hosts not known: processes placed by the wall clock their files hold
        """
        if not self.machines:
            return "hosts not known: processes placed by the wall clock their files hold"
        if len(self.machines) == 1:
            text = f"1 host ({self.machines[0].name}): processes aligned by its monotonic clock"
            text += " (exact)"
        else:
            text = f"{len(self.machines)} machines: " + ", ".join(m.text() for m in self.machines)
            text += "; processes of one machine by its monotonic clock (exact)"
            if any(m.bound_ns for m in self.machines):
                text += "; time within the bound of a step's edge counted as uncertain (±)"
        if self.unknown:
            text += (
                f"; {counted(len(self.unknown), 'process', 'processes')} whose file names no"
                " host placed by the wall clock it holds"
            )
        return text


@dataclass
class _Proc:
    """One process: who, its spans, its machine, how far it is moved onto its machine's one
    anchor, and its extent on that machine's clock."""

    member: Member
    spans: ProcessSpans
    machine: int | None = None
    anchor_shift: int = 0
    extent: Span | None = None


@dataclass
class Aligned:
    """What :func:`align` made: the lanes (one member each: a process, or the lives of one
    that restarted joined on the reference's axis), the loop role and reference (None: no
    process has steps) and the clock note."""

    lanes: list[tuple[Member, ProcessSpans]]
    found: tuple[str, Member] | None
    clock: ClockNote


Pick = Callable[[list[tuple[Member, ProcessSpans]]], "tuple[str, Member] | None"]


def align(processes: Iterable[tuple[Member, ProcessSpans]], pick: Pick) -> Aligned:
    """The lanes and clocks of ``processes`` (each one process's finished spans: a member may
    come several times), ``pick`` choosing the loop role and reference among the lanes (see
    :mod:`mstx_marks.analysis.model.rl_steps`); see the module's docstring."""
    procs = [_Proc(m, s) for m, s in sorted(processes, key=lambda p: (p[0], _order_key(p[1])))]
    machines = _machines(procs)
    for p in procs:
        p.extent = _extent(p.spans, p.anchor_shift)
    lanes, notes = _lanes(procs)
    for m in machines:  # (by their lanes' names: processes at once told apart)
        m.members = sorted({lane for lane, lives in lanes for p in lives if p.machine is not None
                            and machines[p.machine] is m})  # fmt: skip
    merged = [(m, _merged_unshifted(lives)) for m, lives in lanes]
    found = pick(merged)
    reference = [] if found is None else next(lives for m, lives in lanes if m == found[1])
    hosts = sorted({p.spans.host for p in procs if p.spans.host})
    unknown = sorted({lane for lane, lives in lanes if any(p.machine is None for p in lives)})
    clock = ClockNote(hosts, unknown)
    if reference and reference[0].machine is not None:
        _measure(procs, reference, machines)
        clock.machines = _ordered(machines, reference[0].machine)
    else:
        clock.machines = machines
    out: list[tuple[Member, ProcessSpans]] = []
    for lane, lives in lanes:
        shifts = [p.anchor_shift - _offset(p, machines) for p in lives]
        for p, shift in zip(lives, shifts):
            if shift:
                clock.pid_shifts_ns[(lane.role, lane.rank, p.spans.pid)] = shift
        if len(lives) == 1:
            spans = lives[0].spans
            if shifts[0]:
                clock.shifts_ns[lane] = shifts[0]
        else:  # (its lives, each on the reference's axis by its own shift, joined)
            spans = ProcessSpans()
            for p, shift in sorted(zip(lives, shifts), key=lambda x: x[0].extent or (0, 0)):
                spans.merge(_moved(p.spans, shift))
            spans.finish()
        bounds = [machines[p.machine].bound_ns for p in lives if p.machine is not None]
        doubt = max((b for b in bounds if b), default=0)
        if doubt:
            clock.bound_ns[lane] = doubt
        out.append((lane, spans))
    clock.notes = notes + _machine_notes(clock.machines) + _step_notes(lanes)
    return Aligned(out, found, clock)


def _order_key(s: ProcessSpans) -> tuple[int, int, str, int, str]:
    first = min((ss.starts[0] for ss in s.phases.values() if len(ss.starts)), default=0)
    return first, len(s.step_starts), s.host, s.pid, s.instance


def _extent(s: ProcessSpans, shift: int) -> Span | None:
    """When the process was busy or in a step of its own, on its machine's axis."""
    starts = [*s.busy.starts[:1], *s.step_starts[:1]]
    ends = [*s.busy.ends[-1:], *s.step_ends[-1:]]
    if not starts:
        return None
    return min(starts) + shift, max(ends) + shift


def _machines(procs: list[_Proc]) -> list[MachineClock]:
    """Each process's machine (see the module's docstring), and its shift onto that
    machine's one anchor; processes whose file says nothing of where they ran have none."""
    keys: list[str | None] = []
    booted: dict[tuple[str, str], list[int]] = {}  # (host, boot id) -> anchors
    for p in procs:
        s = p.spans
        if s.boot_id and s.anchor_ns is not None:
            booted.setdefault((s.host, s.boot_id), []).append(s.anchor_ns)
    fallback: dict[str, list[int]] = {}  # host -> anchors of processes without a boot id
    for p in procs:
        s = p.spans
        if s.boot_id:
            keys.append(f"boot {s.boot_id}")
            continue
        if not s.host:
            keys.append(None)
            continue
        # an older file of a machine whose newer ones name its boot: that machine
        near = [
            boot
            for (host, boot), anchors in booted.items()
            if host == s.host and s.anchor_ns is not None
            and min(abs(a - s.anchor_ns) for a in anchors) <= ANCHORS_APART
        ]  # fmt: skip
        if near:
            keys.append(f"boot {near[0]}")
            continue
        fallback.setdefault(s.host, []).extend([s.anchor_ns] if s.anchor_ns is not None else [])
        keys.append(f"host {s.host}")
    for host, anchors in fallback.items():  # anchors far apart: machines of one name
        groups = _anchor_groups(anchors)
        for i, p in enumerate(procs):
            if keys[i] == f"host {host}" and len(groups) > 1:
                a = p.spans.anchor_ns
                k = 0 if a is None else next(j for j, g in enumerate(groups) if a in g)
                keys[i] = f"host {host} #{k + 1}" if k else keys[i]
    order = sorted({k for k in keys if k is not None})
    machines: list[MachineClock] = []
    for key in order:
        mine = [p for p, k in zip(procs, keys) if k == key]
        anchors = [p.spans.anchor_ns for p in mine if p.spans.anchor_ns is not None]
        shared = statistics.median_low(anchors) if anchors else None
        for p in mine:
            p.machine = len(machines)
            a = p.spans.anchor_ns
            p.anchor_shift = shared - a if shared is not None and a is not None else 0
        hosts = sorted({p.spans.host for p in mine if p.spans.host})
        boot = mine[0].spans.boot_id
        members = sorted({p.member for p in mine})
        machines.append(MachineClock(key, hosts, boot, members, anchor_ns=shared))
    _name_machines(machines)
    return machines


def _anchor_groups(anchors: list[int]) -> list[set[int]]:
    """Anchors split where consecutive ones lie more than :data:`ANCHORS_APART` apart."""
    groups: list[set[int]] = []
    last = None
    for a in sorted(set(anchors)):
        if last is None or a - last > ANCHORS_APART:
            groups.append(set())
        groups[-1].add(a)
        last = a
    return groups or [set()]


def _name_machines(machines: list[MachineClock]) -> None:
    """Each machine named by its hosts; two of one name told apart by boot id (or by order)."""
    base = {id(m): "/".join(m.hosts) or "?" for m in machines}
    count: dict[str, int] = {}
    for m in machines:
        count[base[id(m)]] = count.get(base[id(m)], 0) + 1
    for i, m in enumerate(machines):
        name = base[id(m)]
        if count[name] > 1:
            name += f" (boot {m.boot_id[:8]})" if m.boot_id else f" (machine {i + 1})"
        m.name = name


def _lanes(procs: list[_Proc]) -> tuple[list[tuple[Member, list[_Proc]]], list[str]]:
    """One lane per process, but the lives of one that restarted (one role and rank, one after
    another) joined; lanes of one member named by pid. And the notes that say so."""
    by_member: dict[Member, list[_Proc]] = {}
    for p in procs:
        by_member.setdefault(p.member, []).append(p)
    out: list[tuple[Member, list[_Proc]]] = []
    notes: list[str] = []
    for member, group in by_member.items():
        lanes: list[list[_Proc]] = []
        for p in sorted(group, key=lambda p: p.extent or (0, 0)):
            home = next((lane for lane in lanes if _after(lane[-1], p)), None)
            if home is None:
                lanes.append([p])
            else:
                home.append(p)
        for lane in lanes:
            if len(lane) > 1:
                pids = ", ".join(str(p.spans.pid) for p in lane)
                notes.append(
                    f"{member.label} restarted: {len(lane)} processes one after another (pids"
                    f" {pids}), each placed by its own host and clock, joined as one"
                )
        if len(lanes) == 1:
            out.append((member, lanes[0]))
            continue
        names = _lane_names(lanes)
        notes.append(
            f"{member.label}: {len(lanes)} processes at once (pids"
            f" {', '.join(str(lane[0].spans.pid) for lane in lanes)}): each its own lane"
        )
        out += [(member._replace(process=n), lane) for n, lane in zip(names, lanes)]
    return sorted(out, key=lambda x: x[0]), notes


def _after(last: _Proc, p: _Proc) -> bool:
    """Whether ``p`` began after ``last`` ended (on their machines' axes: a restart is far
    longer than clocks disagree)."""
    return last.extent is not None and p.extent is not None and p.extent[0] >= last.extent[1]


def _lane_names(lanes: list[list[_Proc]]) -> list[str]:
    names = [f"pid {lane[0].spans.pid}" for lane in lanes]
    if len(set(names)) < len(names):
        names = [f"{n} on {lane[0].spans.host or '?'}" for n, lane in zip(names, lanes)]
    if len(set(names)) < len(names):
        names = [f"{n} #{i + 1}" for i, n in enumerate(names)]
    return names


def _merged_unshifted(lives: list[_Proc]) -> ProcessSpans:
    """The lane's spans as ``pick`` weighs them (step counts and lengths: no shift needed)."""
    if len(lives) == 1:
        return lives[0].spans
    whole = ProcessSpans()
    for p in lives:
        whole.merge(p.spans)
    return whole.finish()


def _offset(p: _Proc, machines: list[MachineClock]) -> int:
    return 0 if p.machine is None else machines[p.machine].offset_ns


def _ordered(machines: list[MachineClock], first: int) -> list[MachineClock]:
    return [machines[first], *(m for i, m in enumerate(machines) if i != first)]


@dataclass
class _Pair:
    """One nested call: who held it, who ran it, which call, and θ's bounds from it (on the
    two machines' axes)."""

    source: str
    holder: _Proc
    held: _Proc
    call: int
    outer: Span
    inner: Span

    def said(self, value: int, how: str) -> str:
        return (
            f"{self.held.member.label}'s {self.source} in {self.holder.member.label}'s call"
            f" {self.call + 1} says {how} {_ahead(value)}"
        )


@dataclass
class _Trip:
    """One clock round trip of a process to a peer on another machine."""

    proc: _Proc
    peer: str
    trip: RoundTrip


def _trip_bounds(
    procs: list[_Proc], machines: list[MachineClock]
) -> tuple[dict[tuple[int, int], list[tuple[Bound, _Pair | _Trip]]], int]:
    """θ's bounds from each round trip, per (peer's machine, process's machine), on the
    machines' axes (see the module's docstring); and how many peers ran on no machine of the
    job (numbered after ``machines``, on their monotonic clock: they only link machines)."""
    by_boot = {m.boot_id: i for i, m in enumerate(machines) if m.boot_id}
    by_host: dict[str, list[int]] = {}
    for i, m in enumerate(machines):
        for host in m.hosts:
            by_host.setdefault(host, []).append(i)
    others: dict[str, int] = {}  # a peer on a machine of no process: its boot id (or host)
    found: dict[tuple[int, int], list[tuple[Bound, _Pair | _Trip]]] = {}
    for p in procs:
        if p.machine is None:
            continue
        for trip in p.spans.round_trips:
            # By boot id; by host name only for a peer that names no boot (a host name is not a
            # machine: containers are all "localhost", and the actor may run where no process
            # of the job recorded).
            named = [i for i in by_host.get(trip.peer_host, []) if not machines[i].boot_id]
            if trip.peer_boot_id:
                peer = by_boot.get(trip.peer_boot_id)
            else:
                peer = named[0] if len(named) == 1 else None
            anchor = 0 if peer is None else machines[peer].anchor_ns
            if peer is None:
                key = trip.peer_boot_id or trip.peer_host
                peer = others.setdefault(key, len(machines) + len(others))
            if peer == p.machine or anchor is None:
                continue  # (the same machine: θ is 0 there, nothing to learn)
            at = trip.peer_ns - trip.peer_anchor_ns + anchor  # (on the peer machine's axis)
            lo, hi = trip.sent_ns + p.anchor_shift - at, trip.received_ns + p.anchor_shift - at
            name = machines[peer].name if peer < len(machines) else trip.peer_host
            found.setdefault((peer, p.machine), []).append(((lo, hi), _Trip(p, name, trip)))
    return found, len(others)


def _calls(p: _Proc, phase: str) -> list[Span]:
    s = p.spans.phases.get(phase)
    if s is None:
        return []
    shift = p.anchor_shift
    return [(a + shift, b + shift) for a, b in zip(s.starts, s.ends)]


def _bursts(p: _Proc, names: Iterable[str], gap: int | None) -> list[Span]:
    """``p``'s ranges of the phases ``names`` grouped into calls: a gap longer than ``gap``
    (None: all one) parts two (an engine's model steps into rollouts, a worker's mini-batches
    into the update they make up); each as its first start and last end, on its machine's
    axis."""
    sets = [p.spans.phases[name] for name in names if name in p.spans.phases]
    spans = sorted((a, b) for s in sets for a, b in zip(s.starts, s.ends))
    out: list[list[int]] = []
    for a, b in spans:
        if out and (gap is None or a - out[-1][1] <= gap):
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a + p.anchor_shift, b + p.anchor_shift) for a, b in out]


def _parting_gap(calls: Sequence[Span]) -> int | None:
    """The gap that parts one of these calls' work from the next's: half the shortest between
    two of them (None: a single call)."""
    gaps = [b[0] - a[1] for a, b in zip(calls, calls[1:])]
    return min(gaps) // 2 if gaps else None


def _is_engine(p: _Proc) -> bool:
    return bool(MODEL_STEPS.intersection(p.spans.phases))


def _pairs(procs: list[_Proc], reference: list[_Proc]) -> list[_Pair]:
    """Every nested call of the sources (see the module's docstring)."""
    ref_role = reference[0].member.role
    found: list[_Pair] = []
    for holder in reference:
        for phase in BLOCKING_PHASES:
            outer = _calls(holder, phase)
            gap = _parting_gap(outer)
            for p in procs:
                if p.member.role == ref_role or p.machine is None:
                    continue
                inner = _bursts(p, [phase], gap)
                for i, j in match_calls(outer, inner):
                    found.append(_Pair(phase, holder, p, i, outer[i], inner[j]))
    drivers = list(reference) + [
        p for p in procs
        if p.member.role != ref_role and p.machine is not None and not _is_engine(p)
        and _calls(p, _ROLLOUT_PHASE)
    ]  # fmt: skip
    for holder in drivers:
        outer = _calls(holder, _ROLLOUT_PHASE)
        if not outer:
            continue
        gap = _parting_gap(outer)
        for p in procs:
            if p is holder or p.machine is None or not _is_engine(p):
                continue
            if p.member.role == holder.member.role:
                continue
            inner = _bursts(p, MODEL_STEPS, gap)
            for i, j in match_calls(outer, inner):
                found.append(_Pair(ROLLOUT, holder, p, i, outer[i], inner[j]))
    return found


def _trusted(
    pairs: list[_Pair],
) -> tuple[dict[tuple[int, str], tuple[bool, bool]], set[tuple[int, str]]]:
    """Per (holder, source): whether its starts' side and its ends' side hold where θ is 0, on
    the holder's own machine; and those trusted unchecked.

    A source with no pair on the holder's machine (a trainer alone on its node, every worker on
    others) cannot be checked there. A worker's range of a blocking phase is the body of the
    very call the holder waits for (verl's trainers await ``compute_log_prob`` and
    ``update_actor``, the asynchronous ones too), so it is trusted unchecked when each such
    call is no longer than the holder's (offset-free: a range the holder does not wait on fails
    this sooner or later; pairs that disagree are still said). An engine's model steps are not:
    whether the holder waited on the whole rollout (synchronous) or on its tail (one step off)
    only the check can tell."""
    sides: dict[tuple[int, str], tuple[bool, bool]] = {}
    fits: dict[tuple[int, str], bool] = {}
    for pair in pairs:
        key = (id(pair.holder), pair.source)
        if pair.held.machine != pair.holder.machine:
            inner, outer = pair.inner[1] - pair.inner[0], pair.outer[1] - pair.outer[0]
            fits[key] = fits.get(key, True) and inner <= outer
            continue
        starts, ends = sides.get(key, (True, True))
        sides[key] = (
            starts and pair.inner[0] >= pair.outer[0],
            ends and pair.inner[1] <= pair.outer[1],
        )
    unchecked = {
        key for key, fit in fits.items()
        if fit and key[1] in BLOCKING_PHASES and key not in sides
    }  # fmt: skip
    sides.update(dict.fromkeys(unchecked, (True, True)))
    return sides, unchecked


def _measure(procs: list[_Proc], reference: list[_Proc], machines: list[MachineClock]) -> None:
    """Each machine's offset from the reference's (see the module's docstring), in place."""
    ref = reference[0].machine
    assert ref is not None
    pairs = _pairs(procs, reference)
    sides, unchecked = _trusted(pairs)
    edges: dict[tuple[int, int], list[tuple[Bound, _Pair | _Trip]]] = {}
    for pair in pairs:
        a, b = pair.holder.machine, pair.held.machine
        starts, ends = sides.get((id(pair.holder), pair.source), (False, False))
        if a is None or b is None or a == b or not (starts or ends):
            continue
        bound = _interval(pair.outer, pair.inner, starts, ends)
        edges.setdefault((a, b), []).append((bound, pair))
        if (id(pair.holder), pair.source) in unchecked and pair.source not in machines[b].unchecked:
            machines[b].unchecked.append(pair.source)
    trips, peers = _trip_bounds(procs, machines)
    for key, found in trips.items():
        edges.setdefault(key, []).extend(found)
    bounds: dict[tuple[int, int], Bound] = {}
    for (a, b), found in edges.items():
        count, lo, hi = marzullo([bound for bound, _ in found])
        linked = [machines[i] for i in (a, b) if i != ref and i < len(machines)]
        trip_bounds = [bound for bound, source in found if isinstance(source, _Trip)]
        nested = len(found) - len(trip_bounds)
        drift = aside = 0
        if count < len(found) and trip_bounds:
            # No one offset satisfies them all. Round trips are causal: they win over nested
            # calls. Those that disagree among themselves, each as narrow as its round trip
            # and spread over the whole job, show a clock that moved (drift, NTP's slewing):
            # the offset lay inside their hull all along.
            count, lo, hi = marzullo(trip_bounds)
            if count < len(trip_bounds):
                lo, hi = min(t[0] for t in trip_bounds), max(t[1] for t in trip_bounds)
                drift = hi - lo - min(t[1] - t[0] for t in trip_bounds)
            aside, nested = nested, 0
        elif count < len(found):  # no offset satisfies them all
            for m in linked:
                m.status = "contradicting"
                m.conflicts = _conflicts([(b, p) for b, p in found if isinstance(p, _Pair)])
            continue
        bounds[(a, b)] = (lo, hi)
        for m in linked:
            m.pairs += nested
            m.round_trips += len(trip_bounds)
            m.drift_ns = max(m.drift_ns, drift)
            m.set_aside += aside
    low, high = _solve(len(machines) + peers, ref, bounds)
    machines[ref].status = "reference"
    for i, m in enumerate(machines):
        if i == ref or m.status == "contradicting":
            continue
        lo, hi = low[i], high[i]
        if lo > hi:  # chained constraints disagree
            m.status, m.conflicts = "contradicting", ["the chained machines' bounds disagree"]
            continue
        m.low_ns = None if lo <= _LOW else lo
        m.high_ns = None if hi >= _HIGH else hi
        if m.low_ns is not None and m.high_ns is not None:
            m.status, m.offset_ns = "measured", (lo + hi) // 2
        elif m.low_ns is not None or m.high_ns is not None:
            # the smallest shift that satisfies the one side (0 when the wall clock does)
            m.status, m.offset_ns = "at least", min(max(0, lo), hi)


def _solve(n: int, ref: int, bounds: dict[tuple[int, int], Bound]) -> tuple[list[int], list[int]]:
    """The tightest bounds of each machine's θ (the reference's 0) under the difference
    constraints ``θ_b - θ_a in bounds[(a, b)]`` (Bellman-Ford both ways, a few machines)."""
    low, high = [_LOW] * n, [_HIGH] * n
    low[ref] = high[ref] = 0
    for _ in range(n + 1):
        changed = False
        for (a, b), (lo, hi) in bounds.items():
            # θ_b <= θ_a + hi, θ_b >= θ_a + lo; θ_a <= θ_b - lo, θ_a >= θ_b - hi
            for node, up in ((b, _add(high[a], hi)), (a, _add(high[b], -lo))):
                if up < high[node]:
                    high[node], changed = up, True
            for node, down in ((b, _add(low[a], lo)), (a, _add(low[b], -hi))):
                if down > low[node]:
                    low[node], changed = down, True
        if not changed:
            break
    return low, high


def _add(x: int, y: int) -> int:
    """``x + y``, unbounded when either is (a bound and its unbounded side never meet: an
    upper bound is added to upper ones, a lower to lower)."""
    if x <= _LOW or y <= _LOW:
        return _LOW
    if x >= _HIGH or y >= _HIGH:
        return _HIGH
    return max(_LOW, min(_HIGH, x + y))


def _conflicts(found: list[tuple[Bound, _Pair]]) -> list[str]:
    """The pairs that cannot both hold: the one that bounds θ highest from below and the one
    that bounds it lowest from above."""
    lows = [(bound[0], pair) for bound, pair in found if bound[0] > _LOW]
    highs = [(bound[1], pair) for bound, pair in found if bound[1] < _HIGH]
    named = []
    if lows and highs:
        lo, a = max(lows, key=lambda x: x[0])
        hi, b = min(highs, key=lambda x: x[0])
        if lo > hi:
            named = [a.said(lo, "at least"), b.said(hi, "at most")]
    return named[:_NAMED] or ["a pair whose inner call is longer than its outer one"]


def _machine_notes(machines: list[MachineClock]) -> list[str]:
    return [
        f"clocks: {m.name}'s pairs contradict each other, so no offset was applied (its clock"
        " may drift against the reference's): " + "; ".join(m.conflicts)
        for m in machines
        if m.status == "contradicting"
    ]


def _step_notes(lanes: list[tuple[Member, list[_Proc]]]) -> list[str]:
    """The processes whose wall clock was stepped while they recorded (said, not applied)."""
    notes = []
    for lane, lives in lanes:
        for p in lives:
            step = p.spans.clock_step_ns
            if step:
                notes.append(
                    f"{lane.label} (pid {p.spans.pid}): its wall clock moved {step / 1e6:+.3f} ms"
                    " against the monotonic one while it recorded (an NTP step): said, not"
                    " applied (its times stay on its clock anchor's axis)"
                )
    return notes


def _moved(s: ProcessSpans, d: int) -> ProcessSpans:
    """A copy of ``s`` whose every time is ``d`` later (a life put on the reference's axis)."""
    out = ProcessSpans(
        host=s.host, anchor_ns=s.anchor_ns, boot_id=s.boot_id, clock_step_ns=s.clock_step_ns,
        pid=s.pid, instance=s.instance, fences=[f + d for f in s.fences],
    )  # fmt: skip
    out.phases = {name: spans.moved(d) for name, spans in s.phases.items()}
    out.busy = s.busy.moved(d)
    out.step_starts = array("q", (t + d for t in s.step_starts))
    out.step_ends = array("q", (t + d for t in s.step_ends))
    out.step_keys = s.step_keys
    batches = Batches().merge(s.batches)
    batches.starts = array("q", (t + d for t in batches.starts))
    batches.ends = array("q", (t + d for t in batches.ends))
    out.batches = batches
    return out


def edge_doubt(spans: ProcessSpans, windows: Sequence[Span], bound: int) -> array[int]:
    """Per window (on the process's own clock), how far its busy time there may be off when
    its clock's offset is known only to within ``bound``: at each edge, what it covers within
    ``bound`` on either side of it (that time may lie on the other side).

    >>> s = ProcessSpans(); s.add(90, 120, "x"); s = s.finish()
    >>> list(edge_doubt(s, [(0, 100), (100, 200)], 5))
    [5, 5]
    """
    out = array("q")
    busy = spans.busy

    def near(t: int) -> int:  # (moved by at most the bound, to one side or the other)
        return max(busy.cover_in(t - bound, t), busy.cover_in(t, t + bound))

    for a, b in windows:
        out.append(min(near(a) + near(b), b - a))
    return out
