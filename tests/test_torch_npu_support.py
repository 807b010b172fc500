"""The torch_npu stand-ins in tests/support behave like the real torch_npu wrapper."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import types
import warnings
from typing import Any, Callable, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import real_torch_npu
from support.fake_mstx_c import NPU_DEVICE_TYPE, BadEnd, Stream, SyncLaunchStream, capture_output
from support.real_torch_npu import (
    FLAVOURS,
    install,
    load_real_experimental_config,
    require_real_torch_npu,
)
from support.torch_npu_double import install_double


class Unbooleable:
    """A message whose truth test raises: the wrapper must swallow that, not propagate it."""

    def __bool__(self) -> bool:
        raise ValueError("ambiguous truth value")

    def __repr__(self) -> str:
        return "Unbooleable()"


class Opaque:
    """Neither a Stream nor falsy; named so that test ids stay stable."""

    def __repr__(self) -> str:
        return "Opaque()"


MESSAGES = ["step", "", b"step", None, 0, 7, Unbooleable()]
DOMAINS = ["default", "d", "", None, 1, b"d"]
STREAMS = [None, 0, Stream(3, 1), Stream("bad"), SyncLaunchStream(3, 1), 1, Opaque(), False]
RANGE_IDS = [1, 0, -4, True, False, "1", 1.0, None]


def _matrix() -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    cases: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    for method in ("mark", "range_start", "range_push"):
        cases += [(method, (m,), {}) for m in MESSAGES]
        cases += [(method, ("m", s), {}) for s in STREAMS]
        cases += [(method, ("m",), {"domain": d}) for d in DOMAINS]
        cases.append((method, ("m", Stream(2, 0), "d"), {}))
    cases += [("range_end", (i,), {}) for i in RANGE_IDS]
    cases += [("range_end", (1,), {"domain": d}) for d in DOMAINS]
    cases += [("range_pop", (), {"domain": d}) for d in DOMAINS]
    return cases


MATRIX = _matrix()
EMPTY_MESSAGE_WARNING = (
    "Invalid message for mstx.range_start function. Please provide a valid message string."
)


@pytest.fixture(scope="module")
def real() -> None:
    require_real_torch_npu()


def observe(
    flavour: str,
    script: Callable[[Any], Any],
    collect: Optional[dict[str, Any]] = None,
    warnings_as_errors: bool = False,
) -> tuple[Any, ...]:
    """Run ``script(mstx)`` on one flavour; return everything a caller or the profiler can see."""
    with install(flavour) as env, capture_output() as cap:
        if warnings_as_errors:
            warnings.simplefilter("error")
        session = env.collect(**collect) if collect is not None else contextlib.nullcontext()
        with session:
            result = script(env.mstx)
    return result, cap.warnings, cap.logs, env.c.calls


def _call(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[Any], Any]:
    return lambda mstx: getattr(mstx, method)(*args, **kwargs)


@pytest.mark.parametrize(("method", "args", "kwargs"), MATRIX, ids=repr)
@pytest.mark.parametrize("collect", [None, {}, {"include": ["d"]}, {"exclude": ["default"]}])
def test_single_calls_match_the_real_wrapper(
    real: None, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], collect: Any
) -> None:
    script = _call(method, args, kwargs)
    assert observe("double", script, collect) == observe("real", script, collect)


@pytest.mark.parametrize(("method", "args", "kwargs"), MATRIX[::3], ids=repr)
def test_warnings_raised_as_errors_are_swallowed_like_the_real_wrapper(
    real: None, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    script = _call(method, args, kwargs)
    double = observe("double", script, {}, warnings_as_errors=True)
    assert double == observe("real", script, {}, warnings_as_errors=True)


def test_double_follows_the_documented_validation() -> None:
    result, warned, logs, calls = observe(
        "double",
        lambda mstx: [
            mstx.range_start(b"x"),
            mstx.range_start("x", 1),
            mstx.range_start("x", SyncLaunchStream()),
            mstx.range_start("x", domain=""),
            mstx.range_push(""),
            mstx.range_pop(""),
            mstx.range_end("1"),
            mstx.mark("x", domain=""),
            mstx.range_end(True),
            mstx.range_start("x", 0),
            mstx.range_start(Unbooleable()),
        ],
        {},
    )
    assert result == [0, 0, 0, 0, -1, -1, None, None, None, 1, None]
    assert [c for c, _ in warned] == [UserWarning] * 7
    assert warned[0] == (UserWarning, EMPTY_MESSAGE_WARNING)
    assert calls == [("mark_on_host", "x", ""), ("range_end", True, "default"),
                     ("range_start_on_host", "x", "default")]  # fmt: skip
    assert logs == [("ERROR", "Call range_start failed. Exception: ambiguous truth value")]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_stream_calls_pass_the_stream_fields(flavour: str) -> None:
    with install(flavour) as env, env.collect() as col:
        stream = env.torch_npu.npu.current_stream()
        range_id = env.mstx.range_start("fwd", stream, "d")
        env.mstx.range_end(range_id, "d")
    assert env.c.calls == [
        ("range_start", "fwd", 0, 0, NPU_DEVICE_TYPE, "d"),
        ("range_end", 1, "d"),
    ]
    assert col.ranges[0].stream is not None and col.ranges[0].closed


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_decorators_keep_the_upstream_quirks(flavour: str) -> None:
    with install(flavour) as env, capture_output() as cap, env.collect() as col:
        mstx = env.mstx

        @mstx.mstx_range("boom")
        def boom() -> None:
            raise KeyError("x")

        @mstx.annotate()
        def named() -> int:
            return 3

        @mstx.annotate("fails")
        def fails() -> None:
            raise KeyError("y")

        with pytest.raises(KeyError):
            boom()
        with pytest.raises(KeyError):
            fails()
        assert boom.__name__ == "inner"
        assert named() == 3
        with mstx.annotate(domain="d"):
            pass
    # mstx_range has no try/finally: the range stays open; the empty context message ends id 0.
    opened = [(r.message, r.closed) for r in col.ranges]
    assert opened == [("boom", False), ("fails", True), ("named", True)]
    assert env.c.calls[-1] == ("range_end", 0, "d")
    assert cap.warnings == [(UserWarning, EMPTY_MESSAGE_WARNING)]


# One step of a random session: (op, args). Range ids are picked from those already returned.
_STEP = st.one_of(
    st.tuples(st.just("collect"), st.sampled_from([{}, {"include": ["d"]}, {"exclude": ["d"]}])),
    st.tuples(st.just("stop"), st.just(())),
    st.tuples(
        st.sampled_from(["mark", "range_start", "range_push"]),
        st.tuples(
            st.sampled_from(["a", "b", "", b"a"]),
            st.sampled_from([None, Stream(1, 0), object()]),
            st.sampled_from(["default", "d", ""]),
        ),
    ),
    st.tuples(
        st.just("range_end"), st.tuples(st.integers(-1, 6), st.sampled_from(["default", "d"]))
    ),
    st.tuples(st.just("range_pop"), st.tuples(st.sampled_from(["default", "d"]))),
)


def _run_session(flavour: str, steps: list[tuple[str, Any]]) -> tuple[Any, ...]:
    returned: list[Any] = []
    with install(flavour) as env, capture_output() as cap:
        for op, args in steps:
            if op == "collect":
                if env.c.collector is None:
                    env.collect(**args)
            elif op == "stop":
                if env.c.collector is not None:
                    env.c.collector.stop()
            elif op == "range_end":
                # Mostly end ids that range_start really returned, sometimes a made-up one.
                ids = [r for r in returned if isinstance(r, int) and r > 0]
                pick, domain = args
                range_id = ids[pick % len(ids)] if ids and pick >= 0 else pick
                returned.append(env.mstx.range_end(range_id, domain))
            else:
                returned.append(getattr(env.mstx, op)(*args))
    return returned, cap.warnings, cap.logs, env.c.calls


@settings(max_examples=150, deadline=None)
@given(st.lists(_STEP, max_size=25))
def test_random_sessions_match_the_real_wrapper(real: None, steps: list[tuple[str, Any]]) -> None:
    assert _run_session("double", steps) == _run_session("real", steps)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_module_tree_has_the_real_shape_and_is_removed_afterwards(flavour: str) -> None:
    sentinel = types.ModuleType("torch_npu")
    sys.modules["torch_npu"] = sentinel
    try:
        before = dict(sys.modules)
        with pytest.raises(RuntimeError, match="inside"), install(flavour) as env:
            import torch_npu
            from torch_npu.npu.mstx import mstx

            assert torch_npu is env.torch_npu and mstx is torch_npu.npu.mstx
            assert isinstance(mstx, type)
            assert isinstance(sys.modules["torch_npu.npu.mstx"], types.ModuleType)
            assert torch_npu._C._mstx is sys.modules["torch_npu._C._mstx"]
            assert torch_npu.npu.streams.Stream is Stream
            raise RuntimeError("inside")
        assert dict(sys.modules) == before
    finally:
        del sys.modules["torch_npu"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_npu_presence_is_switchable(flavour: str) -> None:
    with install(flavour, npu_available=False) as env:
        npu = env.torch_npu.npu
        assert (npu.is_available(), npu.device_count()) == (False, 0)
        with pytest.raises(RuntimeError):
            npu.current_stream()
        env.npu_available, env.device_count = True, 8
        assert (npu.is_available(), npu.device_count()) == (True, 8)
        assert isinstance(npu.current_stream(), npu.streams.Stream)


def test_fake_c_records_only_while_collecting_and_filters_domains() -> None:
    with install_double() as env:
        c = env.c
        assert c._range_start_on_host("off", "default") == 0
        with env.collect(include=["a"], exclude=["a"]) as col:
            assert c._range_start_on_host("in", "a") == 1
            assert c._range_start_on_host("out", "b") == 0
            c._range_end(1, "a")
            c._range_end(0, "a")
        with env.collect(exclude=["b"]) as col2:
            assert c._range_start_on_host("x", "a") == 2
            assert c._range_start_on_host("x", "b") == 0
    assert col.messages() == ["in"] and not col.active
    col.assert_clean()
    assert col2.open_ranges()[0].range_id == 2
    with pytest.raises(AssertionError, match="open"):
        col2.assert_clean()
    assert c.calls[0] == ("range_start_on_host", "off", "default")
    assert col.calls == c.calls[1:5]


def test_fake_c_reports_bad_ends_and_pops() -> None:
    with install_double() as env, env.collect() as col:
        c = env.c
        first = c._range_start_on_host("a", "d")
        c._range_end(first, "d")
        c._range_end(first, "d")
        c._range_end(99, "d")
        c._range_end(c._range_start_on_host("b", "d"), "default")
        assert c._range_pop("d") == -1
    tid = threading.get_native_id()
    assert col.bad_ends == [BadEnd(1, "d", "double", tid), BadEnd(99, "d", "unknown", tid),
                            BadEnd(2, "default", "domain_mismatch", tid)]  # fmt: skip
    assert col.bad_pops == [("d", tid)]
    with pytest.raises(AssertionError, match="bad end"):
        col.assert_clean()


def test_fake_c_keeps_push_stacks_per_thread_and_ends_across_threads() -> None:
    with install_double() as env, env.collect() as col:
        c = env.c
        assert [c._range_push_on_host("p", "d"), c._range_push_on_host("q", "d")] == [0, 1]
        range_id = c._range_start_on_host("r", "d")
        seen: list[int] = []
        worker = threading.Thread(
            target=lambda: (seen.append(c._range_pop("d")), c._range_end(range_id, "d"))
        )
        worker.start()
        worker.join()
        assert seen == [-1]
        assert [c._range_pop("d"), c._range_pop("d")] == [1, 0]
    ended = col.ranges[2]
    assert ended.closed and ended.end_tid != ended.start_tid
    assert len(col.bad_pops) == 1 and not col.open_ranges()


def test_fake_c_rejects_argument_types_like_pybind() -> None:
    with install_double() as env, pytest.raises(TypeError):
        env.c._range_start("m", "0", 0, 0, "d")
    assert env.c.calls == []


def test_capture_output_unsilences_rank_and_restores_env(
    real: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "3")
    config = load_real_experimental_config()
    with capture_output() as cap:
        config._ExperimentalConfig()
    assert cap.logs == [("WARNING", "Please use level1 or level2 if you want to collect aic "
                                    "metrics, reset aic metrics to None!")]  # fmt: skip
    assert sys.modules.get("torch_npu") is None
    assert os.environ["RANK"] == "3"


def test_real_experimental_config_warns_and_passes_values_to_c(real: None) -> None:
    ec = load_real_experimental_config()
    with capture_output() as cap:
        ec._ExperimentalConfig(msprof_tx=True, aic_metrics=ec.AiCMetrics.AiCoreNone)
    assert [c for c, _ in cap.warnings] == [UserWarning] and not cap.lines
    with capture_output() as cap:
        config = ec._ExperimentalConfig(
            profiler_level=ec.ProfilerLevel.Level_none,
            aic_metrics=ec.AiCMetrics.AiCoreNone,
            mstx=True,
            mstx_domain_include=["a"],
            export_type=ec.ExportType.Db,
        )
    assert cap.silent
    kwargs = config().kwargs
    assert (kwargs["msprof_tx"], kwargs["mstx_domain_include"]) == (True, ["a"])


@pytest.mark.parametrize(("ci", "outcome"), [("true", "fail"), ("", "skip")])
def test_missing_wheel_skips_locally_and_fails_in_ci(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, ci: str, outcome: str
) -> None:
    monkeypatch.setenv("MSTX_MARKS_TEST_CACHE", str(tmp_path))
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(real_torch_npu, "_failure", "offline")
    expected = pytest.fail.Exception if outcome == "fail" else pytest.skip.Exception
    with pytest.raises(expected, match="offline"):
        require_real_torch_npu()
