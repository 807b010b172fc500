"""Run inside the grpo venv: can Ray still ship verl's colocated ``WorkerDict`` class?

verl's trainer builds the actor/ref worker class with ``create_colocated_worker_cls`` (a class
made at run time) and Ray pickles it, by value, with cloudpickle when it creates the actor. A
patch that leaves something unpicklable where cloudpickle reaches it (a closure holding a
builtin descriptor, a lock, ...) makes the whole job fail at start-up. This is that step alone,
in seconds; mstx_marks acts only through the environment (``MSTX_MARKS_INSTRUMENT``), as in the
real job (tests/engines/verl_grpo.py).

Prints ``pickled <n> bytes`` and exits 0, or prints the error and exits 1.

usage: python verl_colocated_pickle.py
"""

from __future__ import annotations

import sys


def main() -> int:
    import ray
    import verl  # noqa: F401  (loads the verl.plugins entry points, mstx_marks' included)
    from ray import cloudpickle
    from verl.single_controller.ray.base import RayClassWithInitArgs, create_colocated_worker_cls
    from verl.workers.engine_workers import ActorRolloutRefWorker

    init = RayClassWithInitArgs(
        cls=ray.remote(ActorRolloutRefWorker), config=None, role="actor_rollout"
    )
    worker_dict = create_colocated_worker_cls({"actor_rollout_ref": init})
    cls = worker_dict.cls.__ray_metadata__.modified_class
    try:
        data = cloudpickle.dumps(cls)
    except Exception as exc:
        print(f"cannot pickle verl's colocated WorkerDict class: {type(exc).__name__}: {exc}")
        return 1
    print(f"pickled {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
