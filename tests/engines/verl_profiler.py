"""Run inside the rl venv with ``MSTX_MARKS_INSTRUMENT=verl``: real verl 0.9.1 classes.

1. ``import verl`` (its ``verl.plugins`` entry point loads mstx_marks.launch.plugins, which
activates),    then ``import verl.workers.engine_workers``: report what the preset patched and what
the    stage methods look like afterwards (class attribute, register's marker, the closure cell
   inside ``DistProfiler.annotate``'s wrapper).
2. A real ``DistProfiler`` (tool ``npu``) over a RECORDING STAND-IN for ``torch_npu`` (a fake
   package put in ``sys.modules``: its ``profiler.profile(...)`` objects and its
   ``npu.mstx.range_start/range_end`` only append to a log), so verl's real
   ``NPUProfiler.annotate`` runs. The real ``ActorRolloutRefWorker`` stage methods are called on
   a stand-in worker (``self.profiler`` is that DistProfiler, ``self.actor`` a stand-in engine
   that logs the stage body). Our ranges go to a mstx_marks backend that appends to the same
   log, so the log's order is one logical clock across verl, the stand-in and mstx_marks.

Writes RESULT as JSON. usage: python verl_profiler.py SAVE_DIR RESULT
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import types
from typing import Any

LOG: list[list[Any]] = []


def torch_npu_stand_in() -> None:
    """A fake ``torch_npu`` with only what verl's mstx_profile.py touches; every call is logged."""
    ids = itertools.count(1)

    class mstx:  # stand-in for torch_npu.npu.mstx (a class of static methods, like the real one)
        @staticmethod
        def range_start(message: str, stream: object = None, domain: str = "default") -> int:
            rid = next(ids)
            LOG.append(["verl", "range_start", message, rid])
            return rid

        @staticmethod
        def range_end(range_id: int, domain: str = "default") -> None:
            LOG.append(["verl", "range_end", range_id])

        @staticmethod
        def mark(message: str, stream: object = None, domain: str = "default") -> None:
            LOG.append(["verl", "mark", message])

    class profile:  # stand-in for torch_npu.profiler.profile
        def __init__(self, **kwargs: Any) -> None:
            activities = [str(a) for a in kwargs.get("activities", [])]
            LOG.append(["profiler", "new", activities])

        def start(self) -> None:
            LOG.append(["profiler", "start"])

        def step(self) -> None:
            LOG.append(["profiler", "step"])

        def stop(self) -> None:
            LOG.append(["profiler", "stop"])

    root = types.ModuleType("torch_npu")
    root.__version__ = "2.6.0"  # type: ignore[attr-defined]
    npu = types.ModuleType("torch_npu.npu")
    npu.mstx = mstx  # type: ignore[attr-defined]
    prof = types.ModuleType("torch_npu.profiler")
    prof.ProfilerLevel = types.SimpleNamespace(  # type: ignore[attr-defined]
        Level_none="Level_none", Level0="Level0", Level1="Level1", Level2="Level2"
    )
    prof.ExportType = types.SimpleNamespace(Db="db", Text="text")  # type: ignore[attr-defined]
    prof.ProfilerActivity = types.SimpleNamespace(CPU="CPU", NPU="NPU")  # type: ignore[attr-defined]
    prof._ExperimentalConfig = lambda **kw: dict(kw)  # type: ignore[attr-defined]
    prof.tensorboard_trace_handler = lambda path, analyse_flag=False: path  # type: ignore[attr-defined]
    prof.profile = profile  # type: ignore[attr-defined]
    root.npu, root.profiler = npu, prof  # type: ignore[attr-defined]
    sys.modules.update({"torch_npu": root, "torch_npu.npu": npu, "torch_npu.profiler": prof})


def describe(fn: Any) -> dict[str, Any]:
    code = getattr(fn, "__code__", None)
    return {
        "qualname": getattr(code, "co_qualname", None),
        "file": getattr(code, "co_filename", None),
        "module": getattr(fn, "__module__", None),
    }


def stage_methods(ew: Any) -> dict[str, Any]:
    """Each stage method after the import: the class attribute, register's marker, and the
    function that DistProfiler.annotate's wrapper now calls through its closure."""
    found = {}
    for name in ("compute_log_prob", "compute_ref_log_prob", "update_actor"):
        attr = ew.ActorRolloutRefWorker.__dict__[name]
        chain, f = [], attr
        annotate = None
        while f is not None:
            chain.append(describe(f))
            if getattr(f.__code__, "co_qualname", "").startswith("DistProfiler.annotate."):
                annotate = f
            f = getattr(f, "__wrapped__", None)
        assert annotate is not None, name
        cell = annotate.__closure__[annotate.__code__.co_freevars.index("func")]
        held = cell.cell_contents
        found[name] = {
            "attr": describe(attr),
            "register_marker": hasattr(attr, "attrs_3141562937"),
            "chain": chain,
            "cell": describe(held),
            # functools.wraps in the preset: the cell's function wraps what annotate wrapped.
            "cell_wraps_original": getattr(held, "__wrapped__", None) is annotate.__wrapped__,
        }
    return found


class StandInEngine:
    """Stand-in for the worker's training engine: logs the stage body, returns no output."""

    def infer_batch(self, data: Any) -> None:
        LOG.append(["body", "infer_batch"])

    def train_mini_batch(self, data: Any) -> None:
        LOG.append(["body", "train_mini_batch"])


class StandInWorker:
    """What the real stage methods read from ``self``: profiler, actor, the routing flag."""

    enable_routing_replay = False

    def __init__(self, profiler: Any) -> None:
        self.profiler = profiler
        self.actor = StandInEngine()


def main(save_dir: str, result: str) -> None:
    before = sorted(m for m in sys.modules if m.startswith("mstx_marks"))
    import verl  # noqa: F401  (loads the verl.plugins entry point)

    after_verl = sorted(m for m in sys.modules if m.startswith("mstx_marks"))
    import verl.workers.engine_workers as ew

    import mstx_marks
    import mstx_marks.launch.activate
    from mstx_marks.backends.base import Backend, Emitter
    from mstx_marks.capture import presets

    report: dict[str, Any] = {
        "pid": os.getpid(),
        "mstx_marks_before_import_verl": before,
        "mstx_marks_after_import_verl": after_verl,
        "activated_in": mstx_marks.launch.activate._done_in,
        "patched": list(presets.patched("verl")),
        "methods": stage_methods(ew),
    }

    class Logging(Backend):
        """Our ranges, appended to the same log as the stand-in's calls."""

        name = "logging"

        def emitter(self, stream: object) -> Emitter:
            names: dict[int, str] = {}
            ids = itertools.count(1)

            def start(name: str, domain: str) -> int:
                rid = next(ids)
                names[rid] = name
                LOG.append(["ours", "range_start", name, domain])
                return rid

            def end(rid: int, domain: str) -> None:
                LOG.append(["ours", "range_end", names.pop(rid), domain])

            return Emitter(self, start, end, lambda n, d: LOG.append(["ours", "mark", n]))

    mstx_marks.configure(backend=Logging())

    torch_npu_stand_in()
    from tensordict import TensorDict
    from verl.utils.profiler.config import NPUToolConfig, ProfilerConfig
    from verl.utils.profiler.profile import DistProfiler

    def profiler(discrete: bool) -> Any:
        config = ProfilerConfig(
            tool="npu", enable=True, ranks=[0], save_path=save_dir, tool_config=None
        )
        tool = NPUToolConfig(discrete=discrete, contents=["npu"], level="level1")
        return DistProfiler(rank=0, config=config, tool_config=tool)

    data = TensorDict({}, batch_size=[])
    cls = ew.ActorRolloutRefWorker
    runs: dict[str, Any] = {}

    # Discrete mode: verl builds, starts and stops a profile inside every annotated call.
    prof = profiler(discrete=True)
    prof.start(role="actor")  # the trainer's start_profile: marks this step as profiled
    worker = StandInWorker(prof)
    for name in ("compute_log_prob", "update_actor"):
        del LOG[:]
        getattr(cls, name)(worker, data)
        runs[f"discrete/{name}"] = list(LOG)
    prof.stop()

    # Continuous mode: one profile for the step; verl marks each stage itself.
    prof = profiler(discrete=False)
    worker = StandInWorker(prof)
    del LOG[:]
    prof.start(role="train")
    cls.compute_log_prob(worker, data)
    prof.stop()
    runs["continuous/active"] = list(LOG)
    del LOG[:]
    cls.compute_log_prob(worker, data)  # not a profiled step: verl emits nothing
    runs["continuous/inactive"] = list(LOG)

    report["runs"] = runs
    with open(result, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
