"""Run inside the rl venv: the real verl 0.9.1 reward-loop and TransferQueue agent-loop classes.

``local RESULT`` (with ``MSTX_MARKS_INSTRUMENT=verl``): ``import verl`` arms the preset through
verl's plugin entry point; then

- ``RewardLoopWorker.compute_score_batch`` (real) fans one ``compute_score`` (real, patched)
  out per sample on one event loop: the calls overlap, each sample's reward takes its own time;
- ``AgentLoopWorkerTQ.generate_sequences`` (real, from the ``@ray.remote`` class's original)
  spawns one ``_run_prompt`` task per prompt and returns; the stand-in ``_run_prompt`` (on the
  instance) logs and sleeps;
- a subclass of ``AgentLoopWorker`` defined after the preset patched it.

``ray RESULT`` (no ``MSTX_MARKS_*`` in this driver): a Ray 2.60 cluster whose workers get
``MSTX_MARKS_INSTRUMENT=verl`` from ``runtime_env``. Two actor classes that subclass the real
``AgentLoopWorker`` and override ``generate_sequences`` travel by value, as verl's
``AgentLoopWorkerTQ`` does: ``ByValue`` while this driver has no preset (the actor must patch
it as cloudpickle rebuilds it), ``PatchedHere`` after this driver armed the preset (it arrives
patched: the actor must not wrap it again). Each actor records what one call of its
``generate_sequences`` (through Ray's executor) emitted.

The rl venv has no ``aiohttp``, ``transfer_queue`` or ``torchdata``: the modules import them
for code paths these scenarios never run (HTTP reward models, the TransferQueue client, the
trainer's data loader), so empty stand-ins are put in ``sys.modules`` first.

Writes RESULT as JSON. usage: python verl_v1_loops.py local|ray RESULT
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import os
import sys
import types
from typing import Any

LOG: list[list[Any]] = []


def stand_ins() -> None:
    def missing(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (), {})

    for name in ("aiohttp", "transfer_queue", "torchdata", "torchdata.stateful_dataloader"):
        module = types.ModuleType(name)
        module.__getattr__ = missing  # type: ignore[method-assign]
        sys.modules[name] = module


def logging_backend() -> Any:
    import mstx_marks

    ids = itertools.count(1)

    class Logging(mstx_marks.backends.Backend):
        name = "logging"

        def emitter(self, stream: object) -> mstx_marks.backends.Emitter:
            def start(name: str, domain: str) -> int:
                rid = next(ids)
                LOG.append(["ours", "start", name, rid])
                return rid

            def end(handle: int, domain: str) -> None:
                LOG.append(["ours", "end", handle])

            return mstx_marks.backends.Emitter(self, start, end, lambda n, d: None)

    return Logging()


def ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


async def reward(rl: Any) -> list[dict[str, Any]]:
    delays = [0.08, 0.02, 0.06, 0.04]

    class Manager:  # the reward manager's run_single: one trajectory's score
        async def run_single(self, data: list[int]) -> dict[str, Any]:
            (i,) = data
            LOG.append(["body", "start", i])
            await asyncio.sleep(delays[i])
            LOG.append(["body", "end", i])
            return {"reward_score": float(i)}

    worker = object.__new__(rl.RewardLoopWorker)  # its __init__ loads a tokenizer
    worker.config = ns(
        reward=ns(custom_reward_function=ns(path=None), reward_model=ns(enable=False))
    )
    worker.reward_manager = Manager()
    return await worker.compute_score_batch(list(range(len(delays))))  # type: ignore[no-any-return]


async def agent_loop(cls: Any) -> None:
    import torch
    from tensordict import NonTensorData, TensorDict

    delays = [0.05, 0.01, 0.03]
    worker = object.__new__(cls)  # its __init__ starts servers and the TransferQueue client
    worker.background_tasks = set()
    worker.config = ns(
        actor_rollout_ref=ns(
            rollout=ns(
                temperature=1.0, top_p=1.0, top_k=-1, calculate_log_probs=False,
                val_kwargs=ns(top_p=1.0, top_k=-1, temperature=0.0),
                agent=ns(default_agent_loop="single_turn_agent"),
            )
        )
    )  # fmt: skip

    async def run_prompt(prompt: dict[str, Any], sampling_params: Any, trajectory: Any,
                         trace: bool = False) -> None:  # fmt: skip
        i = int(prompt["index"])
        LOG.append(["prompt", "start", i])
        await asyncio.sleep(delays[i])
        LOG.append(["prompt", "end", i])

    worker._run_prompt = run_prompt
    batch = TensorDict({"index": torch.arange(len(delays))}, batch_size=[len(delays)])
    batch["global_steps"] = NonTensorData(1)
    await worker.generate_sequences(batch)
    LOG.append(["generate_sequences", "returned"])
    while worker.background_tasks:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.01)  # the done callbacks
    LOG.append(["background", "done"])


def local() -> dict[str, Any]:
    stand_ins()
    import verl  # noqa: F401  (its verl.plugins entry point arms the preset)
    import verl.experimental.agent_loop.agent_loop as al
    import verl.experimental.reward_loop.reward_loop as rl
    import verl.trainer.ppo.v1.agent_loop_tq as tqm

    import mstx_marks
    from mstx_marks.capture import presets
    from mstx_marks.capture.presets.target import covered

    mstx_marks.configure(backend=logging_backend())
    tq_cls = tqm.AgentLoopWorkerTQ.__ray_metadata__.modified_class.__ray_actor_class__
    found: dict[str, Any] = {
        "compute_score_is_coroutine": inspect.iscoroutinefunction(
            rl.RewardLoopWorker.compute_score
        ),
        "tq_is_coroutine": inspect.iscoroutinefunction(tq_cls.generate_sequences),
        "tq_covered": covered(vars(tq_cls)["generate_sequences"]),
        "tq_module_attr_is_actor_class": not isinstance(tqm.AgentLoopWorkerTQ, type),
    }

    LOG.clear()
    found["scores"] = asyncio.run(reward(rl))
    found["reward_log"] = list(LOG)

    LOG.clear()
    asyncio.run(agent_loop(tq_cls))
    found["agent_log"] = list(LOG)

    class Late(al.AgentLoopWorker):
        async def generate_sequences(self, batch: Any) -> Any:
            return batch

    found["late_covered"] = covered(vars(Late)["generate_sequences"])
    found["late_is_coroutine"] = inspect.iscoroutinefunction(Late.generate_sequences)
    found["patched"] = list(presets.patched("verl"))
    return found


def ray_actors() -> dict[str, Any]:
    import ray
    import verl.experimental.agent_loop.agent_loop as al

    from mstx_marks.capture import presets
    from mstx_marks.capture.presets.target import covered

    class Probe:  # what each actor class adds to the worker: no verl __init__, a report
        def __init__(self) -> None:
            self.calls = 0

        def records(self) -> dict[str, Any]:
            import mstx_marks
            from mstx_marks.capture.presets.target import covered

            return {
                "pid": os.getpid(),
                "names": [r.name for r in mstx_marks.default_recorder().records()],
                "covered": covered(
                    next(vars(c) for c in type(self).__mro__ if "generate_sequences" in vars(c))[
                        "generate_sequences"
                    ]
                ),
                "patched": list(presets.patched("verl")),
            }

        def use_recorder(self) -> None:
            import mstx_marks

            mstx_marks.configure(backend="record")
            mstx_marks.default_recorder().clear()

    class ByValue(al.AgentLoopWorker):
        def __init__(self) -> None:
            self.calls = 0

        async def generate_sequences(self, batch: Any) -> int:
            await asyncio.sleep(0.01)
            return 2 * batch

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"MSTX_MARKS_INSTRUMENT": "verl"}},
    )
    found: dict[str, Any] = {"driver_armed_before": "verl" in presets._armed}

    def run(cls: type) -> dict[str, Any]:
        actor_cls = ray.remote(num_cpus=0)(type(cls.__name__ + "Actor", (cls, Probe), {}))
        actor = actor_cls.remote()
        ray.get(actor.use_recorder.remote())
        result = ray.get(actor.generate_sequences.remote(21))
        info: dict[str, Any] = ray.get(actor.records.remote())
        info["result"] = result
        return info

    found["by_value"] = run(ByValue)
    found["by_value_covered_in_driver"] = covered(vars(ByValue)["generate_sequences"])

    presets.arm("verl")  # the agent-loop module is imported here: patched now

    class PatchedHere(al.AgentLoopWorker):
        def __init__(self) -> None:
            self.calls = 0

        async def generate_sequences(self, batch: Any) -> int:
            await asyncio.sleep(0.01)
            return 3 * batch

    found["patched_here_covered_in_driver"] = covered(vars(PatchedHere)["generate_sequences"])
    found["patched_here"] = run(PatchedHere)
    ray.shutdown()
    return found


def main(argv: list[str]) -> None:
    mode, result = argv
    found = local() if mode == "local" else ray_actors()
    found["pid"] = os.getpid()
    with open(result, "w") as f:
        json.dump(found, f)


if __name__ == "__main__":
    main(sys.argv[1:])
