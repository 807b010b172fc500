"""Run inside the rl venv: Ray 2.60 actors on CPU, activated by ``runtime_env`` alone.

``hook OUT N1 N2 PAUSE RESULT``: ``worker_process_setup_hook="mstx_marks.activate"``
with ``MSTX_MARKS_OUT=OUT`` in ``env_vars``; two actors (``RANK`` 0 and 1) run N1 and N2 ranges
of a method decorated with ``mstx_marks.mstx_range``, a third actor records nothing; once each
marked actor's spill holds a clock round trip (launch/ray_clock.py), PAUSE seconds later a plain
``ray.shutdown()`` (Ray ends its workers from C++: SIGTERM, then SIGKILL
or ``_exit`` within milliseconds; no atexit hook, no Python signal handler runs).

``verl OUT K RESULT``: the documented verl form, ``env_vars`` only (``MSTX_MARKS_OUT``,
``MSTX_MARKS_INSTRUMENT=verl``), no setup hook: inside an actor, ``import verl`` loads verl's
``verl.plugins`` entry point (mstx_marks.launch.plugins, which activates), then
``import verl.workers.engine_workers``; the actor reports what the preset patched, then calls
the real ``ActorRolloutRefWorker.compute_log_prob`` K times on a stand-in worker with no
profiler (``self.actor`` a stand-in engine), so the patched stage records K ranges.

``env OUT N1 N2 PAUSE RESULT``: ``MSTX_MARKS_OUT`` in ``env_vars`` only (no setup hook, no
framework): two actors of different classes (``Trainer`` and ``Rollout``, both ``RANK`` 0, as
on one GPU) run N1 and N2 ranges; ``import mstx_marks`` in each (unpickling the decorated
method) activates the recording; PAUSE seconds later a plain ``ray.shutdown()``.

Writes RESULT as JSON: the driver's pid and what each actor reported. (Ray is imported inside
the functions: pytest's ``--doctest-modules`` imports this file in the test process too.)
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

STAGE = "actor_stage"
#: Longer than twice the spill interval (0.5 s): what completed is on disk by then.
SPILLED = 1.5


def hook(out: str, n1: int, n2: int, pause: float) -> dict[str, Any]:
    import ray

    from mstx_marks import mstx_range

    @ray.remote(num_cpus=0)
    class Marked:
        @mstx_range(STAGE, domain="ray_test")
        def stage(self, i: int) -> int:
            return i * i

        def run(self, n: int) -> dict[str, Any]:
            for i in range(n):
                self.stage(i)
            return {"pid": os.getpid(), "rank": os.environ.get("RANK"), "ranges": n}

    @ray.remote(num_cpus=0)
    class Idle:
        def run(self) -> dict[str, Any]:
            import mstx_marks.launch.activate as act  # the setup hook ran here too

            return {"pid": os.getpid(), "activated_in": act._done_in}

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={
            "worker_process_setup_hook": "mstx_marks.activate",
            "env_vars": {"MSTX_MARKS_OUT": out},
        },
    )
    actors = [
        Marked.options(runtime_env={"env_vars": {"RANK": str(rank)}}).remote() for rank in (0, 1)
    ]
    idle = Idle.remote()
    marked = ray.get([a.run.remote(n) for a, n in zip(actors, (n1, n2))])
    idle_info = ray.get(idle.run.remote())
    waited = _until_round_trips(out, [m["pid"] for m in marked])
    time.sleep(pause)
    ray.shutdown()
    return {"marked": marked, "idle": idle_info, "round_trips_after_s": waited}


def _until_round_trips(out: str, pids: list[int], limit: float = 90.0) -> float | None:
    """Seconds until each of ``pids``'s spills holds a clock round trip (the clock actor is a
    new worker process: seconds on a loaded machine); None past ``limit``."""
    from pathlib import Path

    began = time.monotonic()
    while time.monotonic() - began < limit:
        texts = [
            "".join(p.read_text(errors="replace") for p in Path(out).glob(f"spill/*-{pid}*.jsonl"))
            for pid in pids
        ]
        if all('"clock round trip"' in t for t in texts):
            return time.monotonic() - began
        time.sleep(0.2)
    return None


def env(out: str, n1: int, n2: int, pause: float) -> dict[str, Any]:
    import ray

    from mstx_marks import mstx_range

    def report(n: int) -> dict[str, Any]:
        import mstx_marks.launch.activate as act
        from mstx_marks.export.out import process_role

        return {"pid": os.getpid(), "ranges": n, "activated_in": act._done_in,
                "role": process_role()}  # fmt: skip

    class Staged:
        @mstx_range(STAGE, domain="ray_test")
        def stage(self, i: int) -> int:
            return i * i

        def run(self, n: int) -> dict[str, Any]:
            for i in range(n):
                self.stage(i)
            return report(n)

    class Trainer(Staged):
        pass

    class Rollout(Staged):
        pass

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"MSTX_MARKS_OUT": out, "RANK": "0"}},
    )
    actors = [ray.remote(num_cpus=0)(c).remote() for c in (Trainer, Rollout)]
    marked = ray.get([a.run.remote(n) for a, n in zip(actors, (n1, n2))])
    time.sleep(pause)
    ray.shutdown()
    return {"marked": marked}


def verl(out: str, calls: int) -> dict[str, Any]:
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def run(self, calls: int) -> dict[str, Any]:
            before = sorted(m for m in sys.modules if m.startswith("mstx_marks"))
            import verl  # noqa: F401  (its verl.plugins entry point loads mstx_marks.launch.plugins)

            after_verl = "mstx_marks.launch.plugins" in sys.modules
            import verl.workers.engine_workers as ew

            import mstx_marks.launch.activate as act
            from mstx_marks.capture import presets

            attr = ew.ActorRolloutRefWorker.__dict__["compute_log_prob"]
            patched = list(presets.patched("verl"))

            class StandInEngine:  # what the stage calls on self.actor: no model here
                def infer_batch(self, data: Any) -> None:
                    return None

            class StandInWorker:  # no profiler: DistProfiler.annotate calls the stage directly
                profiler = None
                enable_routing_replay = False
                actor = StandInEngine()

            from tensordict import TensorDict

            for _ in range(calls):
                ew.ActorRolloutRefWorker.compute_log_prob(StandInWorker(), TensorDict({}, []))
            return {
                "pid": os.getpid(),
                "mstx_marks_before_import_verl": before,
                "plugin_loaded_by_import_verl": after_verl,
                "activated_in": act._done_in,
                "patched": patched,
                "register_attr_kept": hasattr(attr, "attrs_3141562937"),
            }

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"MSTX_MARKS_OUT": out, "MSTX_MARKS_INSTRUMENT": "verl"}},
    )
    info = ray.get(Probe.remote().run.remote(calls))
    time.sleep(SPILLED)
    ray.shutdown()
    return {"probe": info}


def main(argv: list[str]) -> None:
    mode, *args = argv
    if mode == "hook":
        out, n1, n2, pause, result = args
        found = hook(out, int(n1), int(n2), float(pause))
    elif mode == "env":
        out, n1, n2, pause, result = args
        found = env(out, int(n1), int(n2), float(pause))
    elif mode == "verl":
        out, calls, result = args
        found = verl(out, int(calls))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    found["driver_pid"] = os.getpid()
    with open(result, "w") as f:
        json.dump(found, f)


if __name__ == "__main__":
    main(sys.argv[1:])
