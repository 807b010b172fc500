"""experimental_config against the real torch_npu 2.14.0 class; builders, capture_steps on torch."""

from __future__ import annotations

import glob
import json
import types
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fake_mstx_c import capture_output
from support.real_torch_npu import load_real_experimental_config

from mstx_marks.profiling import profiler as mp
from mstx_marks.profiling.profiler import (
    AIC_METRICS,
    build_profiler,
    capture_steps,
    experimental_config,
    profiler_schedule,
)

torch = pytest.importorskip("torch")

DOMAINS = st.lists(
    st.sampled_from(["default", "verl", "communication", "vllm_one_step"]), max_size=4
)


@st.composite
def valid_args(draw: st.DrawFn) -> dict[str, Any]:
    level = draw(st.sampled_from(["level_none", "level0", "level1", "level2", "Level1"]))
    export = draw(st.sampled_from(["db", "text", ["db", "text"], ("text", "db")]))
    args: dict[str, Any] = {"level": level, "export": export}
    side = draw(st.sampled_from(["include", "exclude", None]))
    if side:
        args[side] = draw(DOMAINS)
    if level.lower() in ("level1", "level2"):
        args["aic_metrics"] = draw(st.sampled_from([None, *AIC_METRICS, *AIC_METRICS.values()]))
    for flag in (
        "l2_cache",
        "record_op_args",
        "data_simplification",
        "sys_io",
        "sys_interconnection",
    ):
        args[flag] = draw(st.booleans())
    args["op_attr"] = "db" in export and draw(st.booleans())
    args["gc_detect_threshold"] = draw(st.sampled_from([None, 0.5, 10]))
    args["host_sys"] = draw(st.sampled_from([None, ["cpu", "mem"], ("osrt",)]))
    return args


def _real(kwargs: dict[str, Any]) -> tuple[Any, Any]:
    module = load_real_experimental_config()
    with capture_output() as out:
        config = module._ExperimentalConfig(**kwargs)
        passed = config()
    assert out.warnings == [], out.warnings
    assert out.lines == [], out.lines
    return config, passed


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(valid_args())
def test_real_torch_npu_accepts_every_output_unchanged(args: dict[str, Any]) -> None:
    kwargs = experimental_config(**args, mstx_supported=True)
    config, passed = _real(kwargs)
    assert config._profiler_level == kwargs["profiler_level"]
    assert config._profiler_level.lower() == args["level"].lower()
    assert config._aic_metrics == kwargs["aic_metrics"]
    if args.get("aic_metrics") is not None:
        assert config._aic_metrics == AIC_METRICS.get(args["aic_metrics"], args["aic_metrics"])
    export = [args["export"]] if isinstance(args["export"], str) else list(args["export"])
    assert sorted(config.export_type) == sorted(export)
    assert config._mstx is True and config._msprof_tx is False and config.tx_enabled
    assert sorted(config._mstx_domain_include) == sorted(set(args.get("include") or []))
    assert sorted(config._mstx_domain_exclude) == sorted(set(args.get("exclude") or []))
    for flag in ("l2_cache", "op_attr", "data_simplification", "sys_io", "sys_interconnection"):
        assert getattr(config, f"_{flag}") is args[flag], flag
    assert config.record_op_args is args["record_op_args"]
    assert config._gc_detect_threshold == args["gc_detect_threshold"]
    assert sorted(config._host_sys) == sorted(args["host_sys"] or [])
    assert passed.kwargs["msprof_tx"] is True  # what C receives: tx collection on
    assert passed.kwargs["trace_level"] == kwargs["profiler_level"]


def test_default_config_is_quiet_where_torch_npus_default_warns() -> None:
    module = load_real_experimental_config()
    with capture_output() as out:
        module._ExperimentalConfig()  # torch_npu's own defaults: Level0 with pipe utilization
    assert any("aic metrics" in line for line in out.lines)
    config, _ = _real(experimental_config(mstx_supported=True))
    assert config._aic_metrics == "ACL_AICORE_NONE"
    assert config.export_type == ["db"]


def test_msprof_tx_only_on_releases_without_mstx(monkeypatch: pytest.MonkeyPatch) -> None:
    old = experimental_config(mstx_supported=False)
    assert old["msprof_tx"] is True and "mstx" not in old

    class OldConfig:
        def __init__(self, profiler_level: str = "Level0", msprof_tx: bool = False) -> None:
            pass

    class NewConfig:
        def __init__(self, profiler_level: str = "Level0", mstx: bool = False) -> None:
            pass

    for cls, key in ((OldConfig, "msprof_tx"), (NewConfig, "mstx")):
        fake = types.SimpleNamespace(profiler=types.SimpleNamespace(_ExperimentalConfig=cls))
        monkeypatch.setattr(mp, "_torch_npu", lambda fake=fake: fake)
        assert experimental_config()[key] is True

    def absent() -> Any:
        raise ImportError("no torch_npu")

    monkeypatch.setattr(mp, "_torch_npu", absent)
    assert experimental_config()["mstx"] is True


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ({"include": ["a"], "exclude": ["b"]}, ValueError, "both"),
        ({"level": "level0", "aic_metrics": "PipeUtilization"}, ValueError, "level1 or level2"),
        ({"level": "level_none", "aic_metrics": "ACL_AICORE_MEMORY_UB"}, ValueError, "Level_none"),
        ({"export": "text", "op_attr": True}, ValueError, "op_attr"),
        ({"level": "level3"}, ValueError, "level3"),
        ({"export": "csv"}, ValueError, "csv"),
        ({"export": []}, ValueError, "export"),
        ({"include": "verl"}, TypeError, "list of names"),
        ({"include": ["vllm-one-step"]}, ValueError, "letters"),
        ({"exclude": [1]}, TypeError, "str"),
        ({"l2_cache": 1}, TypeError, "l2_cache"),
        ({"aic_metrics": "Fast", "level": "level1"}, ValueError, "Fast"),
        ({"gc_detect_threshold": -1.0}, ValueError, ">= 0"),
        ({"gc_detect_threshold": True}, TypeError, "number"),
        ({"host_sys": ["gpu"]}, ValueError, "gpu"),
    ],
)
def test_mistakes_are_errors(args: dict[str, Any], error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        experimental_config(**args, mstx_supported=True)


def test_duplicates_dropped_order_kept_and_new_keys_only_when_set() -> None:
    kw = experimental_config(include=("verl", "default", "verl"), mstx_supported=True)
    assert kw["mstx_domain_include"] == ["verl", "default"]
    assert set(kw) == {
        "profiler_level",
        "aic_metrics",
        "export_type",
        "data_simplification",
        "mstx",
        "mstx_domain_include",
    }


def test_schedule_by_keyword_matches_torch() -> None:
    s = profiler_schedule(skip_first=1, wait=1, warmup=1, active=2, repeat=1, npu=False)
    names = [s(i).name for i in range(7)]
    assert names == ["NONE", "NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE", "NONE", "NONE"]
    with pytest.raises(ValueError, match="active"):
        profiler_schedule(active=0, npu=False)


def test_build_profiler_on_cpu_maps_verl_contents(recwarn: pytest.WarningsRecorder) -> None:
    prof = build_profiler(contents=["shapes", "memory", "stack", "module"], active=1, npu=False)
    assert isinstance(prof, torch.profiler.profile)
    assert prof.record_shapes and prof.profile_memory and prof.with_stack and prof.with_modules
    assert torch.profiler.ProfilerActivity.CPU in prof.activities
    assert not [w for w in recwarn if "warmup" in str(w.message)]
    with pytest.raises(ValueError, match="gpu"):
        build_profiler(contents=["gpu"], npu=False)
    with pytest.raises(ValueError, match="both"):
        build_profiler(include=["a"], exclude=["b"], npu=False)


def test_build_profiler_on_npu_passes_keywords_and_real_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: dict[str, Any] = {}
    module = load_real_experimental_config()

    def record(name: str) -> Any:
        def fn(*args: Any, **kwargs: Any) -> Any:
            calls[name] = (args, kwargs)
            return name

        return fn

    profiler = types.SimpleNamespace(
        profile=record("profile"),
        schedule=record("schedule"),
        tensorboard_trace_handler=record("handler"),
        ProfilerActivity=types.SimpleNamespace(CPU="CPU", NPU="NPU"),
        _ExperimentalConfig=module._ExperimentalConfig,
    )
    monkeypatch.setattr(mp, "_torch_npu", lambda: types.SimpleNamespace(profiler=profiler))
    with capture_output() as out:
        build_profiler(contents=["cpu"], level="level1", save_path="/p", wait=1, active=2, npu=True)
    assert out.warnings == [] and out.lines == []
    assert calls["schedule"] == (
        (),
        {"wait": 1, "warmup": 0, "active": 2, "repeat": 1, "skip_first": 0},
    )
    assert calls["handler"] == (("/p",), {"analyse_flag": True})
    kwargs = calls["profile"][1]
    assert kwargs["activities"] == ["CPU"]  # contents without npu: host only, as in verl
    assert kwargs["schedule"] == "schedule" and kwargs["on_trace_ready"] == "handler"
    assert kwargs["experimental_config"]._profiler_level == "Level1"
    assert kwargs["experimental_config"]._mstx is True


def _ranges(path: str) -> list[str]:
    names: list[str] = []
    for trace in sorted(glob.glob(f"{path}/*.json")):
        events = json.load(open(trace))["traceEvents"]  # noqa: SIM115
        names += [e["name"] for e in events if e.get("name", "").startswith("decode#")]
    return sorted(names, key=lambda n: int(n.split("#")[1]))


class Loop:
    def decode(self, x: Any) -> Any:
        return torch.mm(x, x)


@pytest.mark.parametrize(
    ("schedule", "chosen"),
    [
        ({"active": 1}, [0]),
        ({"skip_first": 1, "wait": 1, "warmup": 1, "active": 2}, [3, 4]),
        ({"wait": 1, "active": 1, "repeat": 3}, [1, 3, 5]),
    ],
)
def test_capture_steps_traces_exactly_the_chosen_calls(
    tmp_path: Any, schedule: dict[str, int], chosen: list[int]
) -> None:
    original = Loop.__dict__["decode"]
    handle = capture_steps(Loop, "decode", save_path=str(tmp_path), npu=False, **schedule)
    loop, x = Loop(), torch.ones(4, 4)
    for _ in range(10):
        assert torch.equal(loop.decode(x), torch.mm(x, x))
    assert handle.done and handle.calls == handle.total
    assert Loop.__dict__["decode"] is original
    assert _ranges(str(tmp_path)) == [f"decode#{i}" for i in chosen]


def test_capture_steps_stops_and_restores_on_error(tmp_path: Any) -> None:
    class Boom:
        n = 0

        @staticmethod
        def step() -> None:
            Boom.n += 1
            if Boom.n == 3:
                raise RuntimeError("boom")

    original = Boom.__dict__["step"]
    handle = capture_steps(Boom, "step", active=5, save_path=str(tmp_path), npu=False)
    Boom.step()
    Boom.step()
    with pytest.raises(RuntimeError, match="boom"):
        Boom.step()
    assert handle.done and Boom.__dict__["step"] is original
    names = []
    for trace in glob.glob(f"{tmp_path}/*.json"):
        names += [e["name"] for e in json.load(open(trace))["traceEvents"]]  # noqa: SIM115
    assert {"step#0", "step#1", "step#2"} <= set(names)  # the partial window is flushed


def test_capture_steps_on_instance_and_module_restores_exactly() -> None:
    loop = Loop()
    with capture_steps(loop, "decode", active=3, npu=False, on_trace_ready=lambda p: None) as h:
        loop.decode(torch.ones(2, 2))
        assert "decode" in vars(loop)
    assert h.done and "decode" not in vars(loop) and h.calls == 1
    mod = types.ModuleType("m")
    mod.f = lambda: 1  # type: ignore[attr-defined]
    original = mod.f  # type: ignore[attr-defined]
    h = capture_steps(mod, "f", active=1, npu=False, on_trace_ready=lambda p: None)
    assert mod.f() == 1  # type: ignore[attr-defined]
    assert h.done and mod.f is original  # type: ignore[attr-defined]


def test_capture_steps_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="repeat"):
        capture_steps(Loop, "decode", repeat=0, npu=False)
    with pytest.raises(AttributeError):
        capture_steps(Loop, "nope", npu=False)
    assert Loop.__dict__["decode"].__name__ == "decode"


def test_capture_steps_restores_when_the_trace_handler_raises() -> None:
    class Body:
        def step(self) -> int:
            return 1

    def full_disk(prof: Any) -> None:
        raise OSError("no space left")

    original = Body.__dict__["step"]
    handle = capture_steps(Body, "step", active=1, npu=False, on_trace_ready=full_disk)
    with pytest.raises(OSError, match="no space"):
        Body().step()
    assert handle.done and Body.__dict__["step"] is original
    assert Body().step() == 1


def test_capture_steps_restores_when_the_profiler_cannot_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Body:
        def step(self) -> int:
            return 1

    class Refuses:
        stopped = False

        def start(self) -> None:
            raise RuntimeError("profiler busy")

        def stop(self) -> None:
            Refuses.stopped = True

    monkeypatch.setattr(mp, "build_profiler", lambda **kw: Refuses())
    original = Body.__dict__["step"]
    handle = capture_steps(Body, "step", active=2)
    with pytest.raises(RuntimeError, match="profiler busy"):
        Body().step()
    assert handle.done and Body.__dict__["step"] is original
    assert Refuses.stopped is False  # never started, so never stopped
