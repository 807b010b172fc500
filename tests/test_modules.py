from __future__ import annotations

import os
import sqlite3
import warnings
from collections import Counter
from pathlib import Path
from time import time_ns
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from support.npu_stand_in import add_operators, run_recipe  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from mstx_marks import configure, default_recorder, every  # noqa: E402
from mstx_marks.base.records import RangeRecord  # noqa: E402
from mstx_marks.capture.nn_modules import BACKWARD_DOMAIN, MODULE_DOMAIN, instrument_modules  # noqa: E402
from mstx_marks.export import RankTrace, export_rank  # noqa: E402

nn = torch.nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x: Any) -> Any:
        return self.act(self.proj(x))


class Net(nn.Module):
    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.head = nn.Linear(8, 2)

    def forward(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.fixture(autouse=True)
def _record() -> Any:
    configure(backend="record")
    default_recorder().clear()
    yield
    default_recorder().clear()


def _ranges(domain: str = MODULE_DOMAIN) -> list[RangeRecord]:
    return [
        r for r in default_recorder().records() if isinstance(r, RangeRecord) and r.domain == domain
    ]


def _state(module: Any) -> dict[str, Any]:
    skip = {"_parameters", "_buffers", "_modules"}
    return {
        k: (dict(v) if isinstance(v, dict) else v) for k, v in vars(module).items() if k not in skip
    }


def _parents(ranges: list[RangeRecord]) -> dict[str, set[str]]:
    """Each range's innermost enclosing range name, by time containment (the recipe's rule)."""
    out: dict[str, set[str]] = {}
    for r in ranges:
        around = [
            p for p in ranges if p is not r and p.start_ns <= r.start_ns and r.end_ns <= p.end_ns
        ]
        inner = min(around, key=lambda p: p.end_ns - p.start_ns, default=None)
        out.setdefault(r.name, set()).add(inner.name if inner else "")
    return out


def test_ranges_nest_as_the_module_tree_and_depth_bounds_it() -> None:
    net = Net()
    with instrument_modules(net, depth=2) as hooks:
        net(torch.ones(1, 8))
    assert hooks.patched == (
        "<root> (Net)", "layers.0 (Block)", "layers.1 (Block)", "head (Linear)"
    )  # fmt: skip
    ranges = _ranges()
    assert Counter(r.name for r in ranges) == {"Net": 1, "Block": 2, "Linear": 1}
    assert _parents(ranges) == {"Net": {""}, "Block": {"Net"}, "Linear": {"Net"}}
    default_recorder().clear()
    with instrument_modules(net, depth=None, include=["Linear", "layers.1"], names="path"):
        net(torch.ones(1, 8))
    # The root always counts forwards (for sampling) but gets no range unless chosen.
    assert sorted(r.name for r in _ranges()) == [
        "head",
        "layers.0.proj",
        "layers.1",
        "layers.1.proj",
    ]


def test_undo_restores_every_module_exactly() -> None:
    net = Net()
    before = {name: _state(m) for name, m in net.named_modules()}
    x = torch.randn(3, 8)
    expected = net(x)
    hooks = instrument_modules(net, depth=None, backward=True)
    net(x).sum().backward()
    assert len(_ranges(BACKWARD_DOMAIN)) == len(hooks.patched) == 8
    assert any(m._forward_hooks for m in net.modules())
    hooks.undo()
    hooks.undo()  # idempotent
    assert {name: _state(m) for name, m in net.named_modules()} == before
    assert torch.equal(net(x), expected)


def test_a_forward_that_raises_ends_its_ranges_and_the_next_one_is_clean() -> None:
    net = Net()

    class Boom(Exception):
        pass

    def explode(module: Any, args: Any) -> None:
        raise Boom

    trap = net.head.register_forward_pre_hook(explode)
    with instrument_modules(net, depth=2):
        with pytest.raises(Boom):
            net(torch.ones(1, 8))
        trap.remove()
        net(torch.ones(1, 8))
    ranges = _ranges()
    assert not any(r.open for r in ranges)
    # The head's range started (our pre-hook runs first) and ended when its call raised.
    assert Counter(r.name for r in ranges) == {"Net": 2, "Block": 4, "Linear": 2}
    assert _parents(ranges)["Block"] == {"Net"} and _parents(ranges)["Linear"] == {"Net"}


def test_sampling_keeps_whole_forwards() -> None:
    net = Net()
    with instrument_modules(net, depth=3, sample=every(2)):
        for _ in range(4):
            net(torch.ones(1, 8))
    counts = Counter(r.name for r in _ranges())
    # Forwards 0 and 2 of 4, each a whole tree: Net, 2 Blocks, 3 Linears, 2 ReLUs.
    assert counts == {"Net": 2, "Block": 4, "Linear": 6, "ReLU": 4}


def test_backward_ranges_nest_in_their_own_domain() -> None:
    net = Net()
    with instrument_modules(net, depth=2, backward=True):
        net(torch.ones(2, 8, requires_grad=True)).sum().backward()
    back = _ranges(BACKWARD_DOMAIN)
    assert Counter(r.name for r in back) == {"Net": 1, "Block": 2, "Linear": 1}
    assert _parents(back)["Block"] == {"Net"}
    fwd_end = max(r.end_ns for r in _ranges())
    assert all(r.start_ns >= fwd_end for r in back)


def test_a_second_call_skips_modules_already_hooked() -> None:
    net = Net()
    with instrument_modules(net, depth=1):
        with instrument_modules(net, depth=2) as inner:
            net(torch.ones(1, 8))
        assert ("<root> (Net)", "already instrumented") in inner.skipped
    assert Counter(r.name for r in _ranges()) == {"Net": 1, "Linear": 1, "Block": 2}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"depth": -1}, ValueError),
        ({"depth": True}, TypeError),
        ({"include": "Linear"}, TypeError),
        ({"names": "qualname"}, ValueError),
        ({"under_compile": "trace"}, ValueError),
        ({"sample": 3}, TypeError),
        ({"backward": 1}, TypeError),
    ],
)
def test_bad_arguments_are_errors_at_definition(kwargs: dict[str, Any], error: type) -> None:
    net = Net()
    with pytest.raises(error):
        instrument_modules(net, **kwargs)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in net.modules())
    with pytest.raises(TypeError, match=r"nn\.Module"):
        instrument_modules(object())


def test_a_failing_hook_never_breaks_the_forward(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mstx_marks.core.ranges import Mark

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("backend down")

    monkeypatch.setattr(Mark, "start", broken)
    net = Net()
    expected = net(torch.ones(1, 8))
    with instrument_modules(net, depth=2), warnings.catch_warnings():
        warnings.simplefilter("error")  # our warning must not become the workload's error
        out = net(torch.ones(1, 8))
    assert torch.equal(out, expected) and not _ranges()
    assert "module range start failed (backend down)" in capsys.readouterr().err


@pytest.mark.parametrize(("mode", "expected"), [("skip", 0), ("break", 4)])
def test_under_torch_compile(mode: str, expected: int) -> None:
    torch._dynamo.reset()
    net = Net()
    with instrument_modules(net, depth=2, under_compile=mode):  # type: ignore[arg-type]
        compiled = torch.compile(net, backend="eager")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = compiled(torch.ones(1, 8))
    assert torch.allclose(out, net(torch.ones(1, 8)))
    # skip: Dynamo traced the hooks as no-ops (no range inside the compiled region); break:
    # each hook ran outside the graph, so each module call is a range as in eager mode.
    assert len(_ranges()) == expected
    torch._dynamo.reset()


def test_fsdp_wrapped_modules_are_named_by_their_own_class(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29500 + os.getpid() % 1000)}
    os.environ.update(env)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        net = Net()
        for layer in net.layers:
            fully_shard(layer)
        fully_shard(net)  # FSDP2: classes become FSDPNet, FSDPBlock
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with instrument_modules(net, depth=2, backward=True):
                net(torch.ones(2, 8)).sum().backward()
            assert Counter(r.name for r in _ranges()) == {"Net": 1, "Block": 2, "Linear": 1}
            default_recorder().clear()
            wrapped = FullyShardedDataParallel(Net(), device_id=torch.device("cpu"))  # FSDP1
            with instrument_modules(wrapped, depth=1) as hooks:
                wrapped(torch.ones(1, 8))
        # The FSDP1 wrapper is transparent: no range, no level, no path part.
        assert hooks.patched[1:] == ("head (Linear)",) and hooks.patched[0] == "<root> (Net)"
        assert Counter(r.name for r in _ranges()) == {"Net": 1, "Linear": 1}
    finally:
        dist.destroy_process_group()


class _Ops(TorchDispatchMode):
    """Every aten operator the model runs, with host times on the recorder's clock."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        start = time_ns()
        out = func(*args, **(kwargs or {}))
        self.ops.append((f"aten::{func.__name__.split('.')[0]}", start, time_ns()))
        return out


def test_real_module_statistic_names_our_modules(tmp_path: Path) -> None:
    net = Net(layers=3)
    ops = _Ops()
    with instrument_modules(net, depth=2), ops, torch.no_grad():
        for _ in range(2):
            net(torch.ones(4, 8))
    trace = RankTrace(0, default_recorder().records())
    db = export_rank(tmp_path / "run", trace)[1]
    # The operators' PYTORCH_API rows and their kernels (TASK, COMPUTE_TASK_INFO) stand in for
    # what torch_npu writes on an NPU; the MSTX rows are our own export.
    add_operators(db, ops.ops, tid=trace.ranges[0].pid << 32 | trace.ranges[0].thread)
    out = tmp_path / "out"
    proc = run_recipe("module_statistic", tmp_path / "run", out)
    result = out / "cluster_analysis_output" / "cluster_analysis.db"
    assert result.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    with sqlite3.connect(result) as conn:
        rows = conn.execute(
            "SELECT parentModule, module, opName, opCount, rankID FROM ModuleStatistic"
        ).fetchall()
    by_module: Counter[tuple[str, str]] = Counter()
    for parent, module, _, count, rank in rows:
        assert rank == 0
        by_module[(parent, module)] += count
    # Three Blocks of one class under Net with the same operators: one row each op, counted
    # 3 layers x 2 forwards; the head's operators twice. Each Linear runs one addmm (with a
    # view or two around it); the Block's ReLU is below depth 2, so its op is the Block's.
    assert {k for k in by_module} == {("Net", "Block"), ("Net", "Linear")}
    linear_ops = Counter(op for _, m, op, c, _ in rows if m == "Linear" for _ in range(c))
    assert linear_ops["aten::addmm"] == 2
    block_ops = Counter(op for _, m, op, c, _ in rows if m == "Block" for _ in range(c))
    assert block_ops["aten::addmm"] == 6 and block_ops["aten::relu"] == 6


def test_the_module_presets_hook_the_model_their_loader_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys
    import types

    from mstx_marks.capture import presets

    # Stand-ins with the real attribute paths: vLLM's GPUModelRunner.load_model sets
    # self.model; verl's ActorRolloutRefWorker.init_model builds self.actor.engine.module.
    runner_mod = types.ModuleType("vllm.v1.worker.gpu_model_runner")

    class GPUModelRunner:
        def load_model(self) -> None:
            self.model = Net()

    runner_mod.GPUModelRunner = GPUModelRunner  # type: ignore[attr-defined]
    workers = types.ModuleType("verl.workers.engine_workers")

    class ActorRolloutRefWorker:
        def init_model(self) -> str:
            engine = types.SimpleNamespace(module=Net(layers=1))
            self.actor = types.SimpleNamespace(engine=engine)
            return "built"

    workers.ActorRolloutRefWorker = ActorRolloutRefWorker  # type: ignore[attr-defined]
    for name, mod in [
        ("vllm.v1.worker.gpu_model_runner", runner_mod),
        ("verl.workers.engine_workers", workers),
    ]:
        monkeypatch.setitem(sys.modules, name, mod)
    handles = [presets.apply("vllm_modules"), presets.apply("verl_modules")]
    try:
        runner = GPUModelRunner()
        runner.load_model()
        runner.model(torch.ones(1, 8))
        worker = ActorRolloutRefWorker()
        assert worker.init_model() == "built"
        worker.actor.engine.module(torch.ones(1, 8))
    finally:
        for h in handles:
            h.undo()
    # depth 4 reaches each Block's Linear and ReLU: two forwards, 2 + 1 Blocks.
    assert Counter(r.name for r in _ranges()) == {"Net": 2, "Block": 3, "Linear": 5, "ReLU": 3}
    # undo unhooked the models the loaders had built too: no more ranges, no hooks left
    before = len(_ranges())
    runner.model(torch.ones(1, 8))
    worker.actor.engine.module(torch.ones(1, 8))
    assert len(_ranges()) == before
    for model in (runner.model, worker.actor.engine.module):
        for m in model.modules():
            assert not m._forward_pre_hooks and not m._forward_hooks
