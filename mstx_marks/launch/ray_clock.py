"""Round trips to a clock actor: each Ray process's clock measured against one reference.

Nested calls bound a machine's clock offset only as tightly as a job's calls happen to nest,
and not at all in a job whose calls do not (:mod:`mstx_marks.analysis.model.clocks`). On Ray
every recording process (``MSTX_MARKS_OUT``) also measures its clock against one small actor,
``mstx_marks_clock`` (no CPU; made by the first process that asks, on that process's node: the
driver's, in practice), as Intel Trace Collector and Open MPI's ``mpisync`` do: :data:`ROUNDS`
calls in a row, the one with the shortest round trip kept (its bound is the tightest), recorded
as a :class:`~mstx_marks.base.records.RoundTrip` instant straight into the recorder (no device
mark, no domain filter: it is the files' own bookkeeping). At once, then at doubling
intervals up to :data:`PERIOD`: Ray kills a worker tens of milliseconds after SIGTERM, so the
samples must be in the spill (written twice a second) long before the end, and repeated
samples show a drifting clock. ``MSTX_MARKS_RAY_CLOCK=0`` turns it off.

It waits for Ray without importing it: a thread starts when ``ray`` is imported and measures
once ``ray.is_initialized()``; it never raises, and a failing actor is said once and asked
again later.

>>> class Local:  # Ray, as seen from the actor's own process: each call answers at once
...     def get(self, value: object, timeout: float) -> object:
...         return value
>>> class Handle:
...     class now:
...         remote = staticmethod(lambda: ClockActor.now(None))  # type: ignore[arg-type]
>>> t = measure(Local(), Handle())
>>> t.sent_ns <= t.peer_ns <= t.received_ns, t.peer_host == socket.gethostname()
(True, True)
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from types import ModuleType
from typing import Any

from mstx_marks.backends.record import anchor_ns, default_recorder, now_ns
from mstx_marks.base import env
from mstx_marks.base.diagnostics import warn_once
from mstx_marks.base.import_hooks import when_imported
from mstx_marks.base.records import CLOCK_DOMAIN, ROUND_TRIP, RoundTrip
from mstx_marks.export.spill import boot_id

__all__ = ["ACTOR", "FIRST", "PERIOD", "ROUNDS", "ClockActor", "arm", "measure"]

#: The clock actor's name, in the namespace :data:`NAMESPACE`.
ACTOR = "mstx_marks_clock"
NAMESPACE = "mstx_marks"
#: Calls per exchange; the one with the shortest round trip is kept.
ROUNDS = 5
#: Seconds before the first exchange, and the longest between two (they double in between).
FIRST, PERIOD = 0.5, 30.0
#: How long one call may take before the exchange is given up (a busy or dying cluster).
CALL_SECONDS = 10.0
#: Failed exchanges, none measured, before it is said.
_SAY_AFTER = 3
#: Round trips kept while the process has recorded nothing (the latest).
_KEPT = 8

_started: list[int] = []  # the pids whose thread was started (a forked child starts none)
_in_the_actor = False  # the clock actor's own process measures nothing


class ClockActor:
    """What the actor answers: its clock on its axis (monotonic plus anchor), its anchor, its
    host and boot id."""

    def __init__(self) -> None:
        global _in_the_actor
        _in_the_actor = True

    def now(self) -> tuple[int, int, str, str]:
        return now_ns(), anchor_ns(), socket.gethostname(), boot_id()


def arm() -> bool:
    """Measure this process's clock once Ray runs in it (see the module's docstring); whether
    it will (not with ``MSTX_MARKS_RAY_CLOCK=0``)."""
    if not env.flag(env.RAY_CLOCK, default=True):
        return False
    when_imported("ray", _start)
    return True


def _start(_ray: ModuleType) -> None:
    if os.getpid() in _started:
        return
    _started.append(os.getpid())
    threading.Thread(target=_measure_while_ray_runs, name="mstx-marks-clock", daemon=True).start()


def _measure_while_ray_runs() -> None:
    due = wait = FIRST
    actor: Any = None
    failed = measured = 0
    pending: list[RoundTrip] = []  # measured before the process recorded anything
    while not _in_the_actor:
        time.sleep(FIRST)
        _record(pending)
        due -= FIRST
        if due > 0:
            continue
        ray = sys.modules.get("ray")
        try:
            if ray is None or not ray.is_initialized():
                actor, due = None, FIRST  # not yet (the driver's ray.init) or no more
                continue
            actor = actor or _actor(ray)
            trip = measure(ray, actor)
        except Exception as exc:  # a Ray being shut down, an actor killed: ask again later
            failed += 1
            if failed >= _SAY_AFTER and not measured:  # (one failure at a job's end is none)
                warn_once(
                    "ray clock",
                    f"no clock round trip to the Ray actor {ACTOR} in {failed} tries"
                    f" ({type(exc).__name__}: {exc}); this process's machine is aligned from"
                    " nested calls alone; trying again",
                )
            actor, wait = None, min(2 * wait, PERIOD)
            due = wait
            continue
        measured += 1
        pending[:] = [*pending[-(_KEPT - 1) :], trip]
        _record(pending)
        wait = min(2 * wait, PERIOD)
        due = wait


def _record(pending: list[RoundTrip]) -> None:
    """Record the round trips measured so far, once the process recorded anything of its own:
    a process that records nothing (an idle Ray worker, the clock actor) writes no file for
    them."""
    if pending:
        recorder = default_recorder()
        if recorder.used:
            for trip in pending:
                recorder.instant_with_args(ROUND_TRIP, CLOCK_DOMAIN, trip.args())
            pending.clear()


def _actor(ray: Any) -> Any:
    """The clock actor, made on this node if nobody made it yet."""
    from ray.util.scheduling_strategies import (  # type: ignore[import-not-found,unused-ignore]
        NodeAffinitySchedulingStrategy,
    )

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    # Owned by its maker, not detached: it ends with the job (on a long-lived cluster a
    # detached one would outlive every job); a process that finds it gone makes it again.
    remote = ray.remote(num_cpus=0)(ClockActor)
    return remote.options(
        name=ACTOR, namespace=NAMESPACE, get_if_exists=True, scheduling_strategy=here
    ).remote()


def measure(ray: Any, actor: Any, rounds: int = ROUNDS) -> RoundTrip:
    """One exchange with ``actor`` (a :class:`ClockActor` handle): ``rounds`` calls, the one
    with the shortest round trip."""
    best: RoundTrip | None = None
    for _ in range(rounds):
        sent = now_ns()
        peer, peer_anchor, host, boot = ray.get(actor.now.remote(), timeout=CALL_SECONDS)
        trip = RoundTrip(sent, now_ns(), peer, host, boot, peer_anchor)
        if best is None or trip.received_ns - trip.sent_ns < best.received_ns - best.sent_ns:
            best = trip
    assert best is not None
    return best
