"""instrument(): patch at run time, undo exactly, never wrap twice (presets: test_presets.py)."""

from __future__ import annotations

import asyncio
import inspect
import threading
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from conftest import caught
from support.stand_ins import fake_module
from support.threads import run_threads

import mstx_marks
from mstx_marks import first
from mstx_marks.base import phases
from mstx_marks.capture.instrument import Instrumented, instrument

Snapshot = list[tuple[str, Any]]


def snapshot(owner: object) -> Snapshot:
    return list(vars(owner).items())


def assert_unchanged(owner: object, before: Snapshot) -> None:
    """Same keys in the same order, each bound to the very same object."""
    after = snapshot(owner)
    assert [k for k, _ in after] == [k for k, _ in before]
    for (key, old), (_, new) in zip(before, after):
        assert new is old, key


def names_of(rec: mstx_marks.Recorder) -> list[str]:
    return [r.name for r in rec.records() if r.kind == "range"]


# --- instrument() on every function kind ------------------------------------------------------


class Worker:
    def plain(self, x: int) -> int:
        return x + 1

    @staticmethod
    def static(x: int) -> int:
        return x + 2

    @classmethod
    def klass(cls, x: int) -> tuple[str, int]:
        return cls.__name__, x + 3

    async def coro(self, x: int) -> int:
        await asyncio.sleep(0)
        return x + 4

    def gen(self, n: int) -> Iterator[int]:
        yield from range(n)

    async def agen(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i


KINDS = ["plain", "static", "klass", "coro", "gen", "agen"]


def call_all(w: Worker) -> list[Any]:
    async def agen_list() -> list[int]:
        return [i async for i in w.agen(2)]

    return [
        w.plain(1),
        Worker.static(1),
        Worker.klass(1),
        asyncio.run(w.coro(1)),
        list(w.gen(2)),
        asyncio.run(agen_list()),
    ]


def test_every_method_kind_keeps_its_kind_result_and_is_restored(
    recorder: mstx_marks.Recorder,
) -> None:
    before = snapshot(Worker)
    expected = call_all(Worker())
    with instrument(Worker, KINDS, domain="verl") as handle:
        assert isinstance(vars(Worker)["static"], staticmethod)
        assert isinstance(vars(Worker)["klass"], classmethod)
        assert inspect.iscoroutinefunction(Worker.coro)
        assert inspect.isgeneratorfunction(Worker.gen)
        assert inspect.isasyncgenfunction(Worker.agen)
        assert call_all(Worker()) == expected
    assert handle.patched == tuple(f"{__name__}:Worker.{k}" for k in KINDS)
    assert sorted(names_of(recorder)) == sorted(f"Worker.{k}" for k in KINDS)
    assert {r.domain for r in recorder.records()} == {"verl"}
    assert_unchanged(Worker, before)


def test_module_functions_are_wrapped_and_restored(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    def compute_score(x: int) -> int:
        return x * 2

    module = fake_module(monkeypatch, "rewards.rule", compute_score=compute_score)
    before = snapshot(module)
    handle = instrument("rewards.rule", "compute_score", name=phases.COMPUTE_SCORE)
    assert module.compute_score(4) == 8
    assert module.compute_score.__wrapped__ is compute_score
    handle.undo()
    assert_unchanged(module, before)
    assert names_of(recorder) == ["compute_score"]


def test_default_names_are_qualified(recorder: mstx_marks.Recorder) -> None:
    module = types.ModuleType("helpers")

    def tokenize() -> None:
        pass

    module.tokenize = tokenize  # type: ignore[attr-defined]
    with instrument(Worker, "plain"), instrument(module, "tokenize"):
        Worker().plain(0)
        module.tokenize()
    assert names_of(recorder) == [
        "Worker.plain",
        "test_default_names_are_qualified.<locals>.tokenize",
    ]


def test_a_phase_name_brings_its_domain_unless_one_is_given(
    recorder: mstx_marks.Recorder,
) -> None:
    with instrument(Worker, "plain", name=phases.VLLM_ONE_STEP):
        Worker().plain(0)
    with instrument(Worker, "plain", name=phases.VLLM_ONE_STEP, domain="rollout"):
        Worker().plain(0)
    got = [(r.name, r.domain) for r in recorder.records()]
    assert got == [("vllm_one_step", "vllm_one_step"), ("vllm_one_step", "rollout")]


# --- inheritance, twice, undo ------------------------------------------------------------------


class Base:
    def run(self) -> str:
        return "base"


class Child(Base):
    pass


def test_inherited_methods_are_overridden_on_the_target_only(
    recorder: mstx_marks.Recorder,
) -> None:
    base_before, child_before = snapshot(Base), snapshot(Child)
    handle = instrument(Child, "run")
    assert "run" in vars(Child)
    assert vars(Base)["run"] is base_before[[k for k, _ in base_before].index("run")][1]
    assert (Child().run(), Base().run()) == ("base", "base")
    assert names_of(recorder) == ["Child.run"]
    handle.undo()
    assert "run" not in vars(Child)
    assert_unchanged(Child, child_before)
    assert_unchanged(Base, base_before)


def test_instrumenting_twice_wraps_once(recorder: mstx_marks.Recorder) -> None:
    first_handle = instrument(Worker, "plain")
    wrapper = vars(Worker)["plain"]
    second = instrument(Worker, ["plain"], name="other")
    assert second.patched == ()
    assert second.skipped == ((f"{__name__}:Worker.plain", "already instrumented"),)
    assert vars(Worker)["plain"] is wrapper
    Worker().plain(0)
    assert names_of(recorder) == ["Worker.plain"]
    second.undo()
    assert vars(Worker)["plain"] is wrapper
    first_handle.undo()


def test_a_subclass_of_an_instrumented_class_is_not_wrapped_again(
    recorder: mstx_marks.Recorder,
) -> None:
    with instrument(Base, "run"):
        assert instrument(Child, "run").skipped == (
            (f"{__name__}:Child.run", "already instrumented"),
        )
        assert "run" not in vars(Child)
        Child().run()
    assert names_of(recorder) == ["Base.run"]


def test_undo_is_idempotent_and_reinstrumenting_after_undo_works(
    recorder: mstx_marks.Recorder,
) -> None:
    before = snapshot(Worker)
    handle = instrument(Worker, "plain")
    handle.undo()
    handle.undo()
    assert_unchanged(Worker, before)
    with instrument(Worker, "plain") as again:
        assert again.patched
        Worker().plain(0)
    assert names_of(recorder) == ["Worker.plain"]
    assert_unchanged(Worker, before)


def test_undo_leaves_a_later_patch_in_place_with_a_warning() -> None:
    class Engine:
        def step(self) -> int:
            return 1

    handle = instrument(Engine, "step")

    def theirs(self: Engine) -> int:
        return 2

    Engine.step = theirs  # type: ignore[method-assign]
    with pytest.warns(mstx_marks.MstxMarksWarning, match="replaced after it was instrumented"):
        handle.undo()
    assert vars(Engine)["step"] is theirs


def test_instances_can_be_instrumented(recorder: mstx_marks.Recorder) -> None:
    w = Worker()
    with instrument(w, "plain", name="this_worker_only"):
        assert "plain" in vars(w)
        assert (w.plain(1), Worker().plain(1)) == (2, 2)
    assert "plain" not in vars(w)
    assert names_of(recorder) == ["this_worker_only"]


def test_function_attributes_survive_for_dispatch_decorators() -> None:
    class RayWorker:
        def update_actor(self) -> None:
            pass

    # verl's @register stores its dispatch mode as a function attribute.
    RayWorker.update_actor.attrs_3141562937 = {"dispatch_mode": "DP"}  # type: ignore[attr-defined]
    with instrument(RayWorker, "update_actor"):
        assert RayWorker.update_actor.attrs_3141562937 == {"dispatch_mode": "DP"}  # type: ignore[attr-defined]
        assert RayWorker.update_actor.__name__ == "update_actor"


def test_each_attribute_counts_its_own_calls_for_sampling(recorder: mstx_marks.Recorder) -> None:
    w = Worker()
    with instrument(Worker, ["plain", "gen"], sample=first(2)):
        for _ in range(5):
            w.plain(0)
            list(w.gen(1))
    assert sorted(names_of(recorder)) == ["Worker.gen"] * 2 + ["Worker.plain"] * 2


def test_concurrent_instrumenting_patches_exactly_once() -> None:
    class Engine:
        def step(self) -> None:
            pass

    original = vars(Engine)["step"]
    handles: list[Instrumented] = []
    barrier = threading.Barrier(16)

    def race() -> None:
        barrier.wait()
        handles.append(instrument(Engine, "step"))

    run_threads(race, [() for _ in range(16)])
    assert sum(len(h.patched) for h in handles) == 1
    assert sum(len(h.skipped) for h in handles) == 15
    assert vars(Engine)["step"].__wrapped__ is original
    for h in handles:
        h.undo()
    assert vars(Engine)["step"] is original


# --- errors -------------------------------------------------------------------------------------


def test_a_missing_attribute_names_the_target_and_what_exists() -> None:
    before = snapshot(Worker)
    with pytest.raises(AttributeError) as info:
        instrument(Worker, ["plain", "plian"])
    message = str(info.value)
    assert f"{__name__}:Worker has no attribute 'plian'" in message
    assert "close: plain" in message
    assert "its public callables: agen, coro, gen, klass, plain, static" in message
    assert_unchanged(Worker, before)


def test_a_missing_class_in_an_import_path_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_module(monkeypatch, "vllm.v1.engine.llm_engine", LLMEngine=Worker)
    with pytest.raises(
        AttributeError, match=r"vllm\.v1\.engine\.llm_engine has no attribute 'LLM'"
    ):
        instrument("vllm.v1.engine.llm_engine:LLM", "step")
    with pytest.raises(ModuleNotFoundError):
        instrument("vllm.v2.engine:LLMEngine", "step")


class Odd:
    size = 3
    Inner = Worker

    @property
    def prop(self) -> int:
        return 1


@pytest.mark.parametrize(
    ("attrs", "kwargs", "error", "match"),
    [
        ("size", {}, TypeError, "Odd.size: it is a int, not a function"),
        ("prop", {}, TypeError, "Odd.prop: it is a property"),
        ("Inner", {}, TypeError, "it is a class; instrument its methods"),
        ([], {}, ValueError, "at least one attribute"),
        (["not-an-identifier"], {}, ValueError, "must be Python identifiers"),
        ([3], {}, ValueError, "must be Python identifiers"),
        ("__init__", {"name": ""}, ValueError, "non-empty"),
        ("__init__", {"name": 3}, TypeError, "range name must be a str"),
        ("__init__", {"domain": "my-domain"}, ValueError, "letters, digits and '_'"),
        ("__init__", {"sample": 5}, TypeError, "sampling policy"),
        ("__init__", {"stream": "next"}, ValueError, "stream must be"),
    ],
)
def test_bad_requests_are_clear_errors_and_patch_nothing(
    attrs: Any, kwargs: dict[str, Any], error: type, match: str
) -> None:
    before = snapshot(Odd)
    with pytest.raises(error, match=match):
        instrument(Odd, attrs, **kwargs)
    assert_unchanged(Odd, before)


def test_an_owner_refusing_one_attribute_gets_none() -> None:
    class Picky(type):
        def __setattr__(cls, key: str, value: Any) -> None:
            if key == "second":
                raise TypeError("read-only attribute")
            super().__setattr__(key, value)

    class Guarded(metaclass=Picky):
        def first(self) -> None:
            pass

        def second(self) -> None:
            pass

    before = snapshot(Guarded)
    with pytest.raises(TypeError, match="read-only"):
        instrument(Guarded, ["first", "second"])
    assert_unchanged(Guarded, before)
    assert instrument(Guarded, "first").patched  # nothing was left registered as ours


# --- anything callable ---------------------------------------------------------------------------


def test_callables_that_do_not_bind_stay_unbound_on_a_class(recorder: mstx_marks.Recorder) -> None:
    import functools
    import os

    class Holder:
        getpid = os.getpid  # a C function: called without the instance
        scaled = functools.partial(lambda x, k: x * k, k=3)  # a partial: same

        class _Call:
            def __call__(self, x: int) -> int:
                return x + 100

        plus = _Call()  # a callable instance: same

    with instrument(Holder, ["getpid", "scaled", "plus"]):
        h = Holder()
        assert h.getpid() == os.getpid() and Holder.getpid() == os.getpid()
        assert h.scaled(2) == 6 and h.plus(1) == 101
    assert [r.name.split("<locals>.")[-1] for r in recorder.records()] == [
        "Holder.getpid",
        "Holder.getpid",
        "Holder.scaled",
        "Holder.plus",
    ]
    assert Holder.__dict__["getpid"] is os.getpid  # undo restored the exact object


def test_a_c_function_on_a_class_from_torch(recorder: mstx_marks.Recorder) -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    class Act:
        gelu = F.gelu

    with instrument(Act, "gelu"):
        out = Act().gelu(torch.ones(2))
    assert tuple(out.shape) == (2,)
    assert [r.name.split("<locals>.")[-1] for r in recorder.records()] == ["Act.gelu"]


def test_instrumenting_a_builtin_the_recorder_uses_does_not_recurse(
    recorder: mstx_marks.Recorder,
) -> None:
    import builtins

    with instrument(builtins, ["len", "next", "isinstance"]):
        assert len([1, 2, 3]) == 3
        assert next(iter([7])) == 7
        assert isinstance(1, int)
    assert builtins.len is len
    ranges = recorder.records()
    names = [r.name for r in ranges]
    assert {"len", "next", "isinstance"} <= set(names)
    # no recursion: the library's own calls of these builtins, made inside a range, record none
    spans = sorted((r.start_ns, r.end_ns) for r in ranges if r.thread == ranges[0].thread)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_after_undo_under_a_foreign_patch_our_wrapper_stops_emitting(
    recorder: mstx_marks.Recorder,
) -> None:
    class Engine:
        def step(self) -> int:
            return 1

    handle = instrument(Engine, "step")
    ours = Engine.step

    def foreign(self: Engine) -> int:  # another tool wraps what it found: our wrapper
        return ours(self) + 10

    Engine.step = foreign  # type: ignore[method-assign]
    with caught() as w:
        handle.undo()
    assert len(w) == 1 and "switched off" in str(w[0].message)
    assert Engine.__dict__["step"] is foreign  # their patch is kept
    assert Engine().step() == 11
    assert recorder.records() == []  # our orphaned wrapper no longer emits
    again = instrument(Engine, "step")  # instrumenting again wraps once: one range per call
    assert Engine().step() == 11
    assert [r.name.split("<locals>.")[-1] for r in recorder.records()] == ["Engine.step"]
    again.undo()
