"""configure, is_active, the environment (read at first use), domain and rank filters."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import Tape, caught

import mstx_marks
from mstx_marks import backends, configure, current_backend, is_active, mark
from mstx_marks.core import configuration as settings
from mstx_marks.core.process import PROCESS

ROOT = Path(__file__).resolve().parents[1]


# --- configure ------------------------------------------------------------------------------------


def test_unknown_backend_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match="'cuda'"):
        configure(backend="cuda")


def test_include_and_exclude_together_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="verl"):
        configure(include=["verl"], exclude=["other"])


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"enabled": 1}, TypeError, "1"),
        ({"include": "verl"}, TypeError, "'verl'"),
        ({"exclude": ["bad-domain"]}, ValueError, "'bad-domain'"),
        ({"include": [b"verl"]}, TypeError, "b'verl'"),
        ({"ranks": "0"}, TypeError, "'0'"),
        ({"ranks": [-1]}, ValueError, "-1"),
        ({"ranks": [True]}, ValueError, "True"),
        ({"ranks": [1.0]}, ValueError, "1.0"),
    ],
)
def test_bad_configure_values_are_refused(kwargs: dict[str, Any], error: type, text: str) -> None:
    configure(backend="record")
    with pytest.raises(error, match=text.replace(".", r"\.")):
        configure(**kwargs)
    assert is_active()  # a refused call changes nothing


def test_is_active_follows_backend_enabled_and_filters() -> None:
    configure(backend="noop")
    assert not is_active() and not is_active("verl")
    configure(backend="record")
    assert is_active() and is_active("verl") and is_active("default")
    configure(include=["verl"])
    assert is_active("verl") and not is_active() and not is_active("default")
    configure(exclude=["verl"])  # replaces include
    assert not is_active("verl") and is_active() and is_active("other")
    configure(exclude=[])  # clears
    assert is_active("verl")
    configure(include=["default"])
    assert is_active() and not is_active("verl")
    configure(enabled=False)
    assert not is_active() and not is_active("default")
    configure(enabled=True)
    assert is_active() and not is_active("verl")  # the filter survived the toggle


def test_is_active_checks_the_domain_name() -> None:
    with pytest.raises(ValueError, match="'a-b'"):
        is_active("a-b")


def test_configure_with_a_backend_instance(tape: Tape) -> None:
    assert current_backend() is tape
    with mark("x"):
        pass
    assert [r.name for r in tape.ranges.values()] == ["x"]


def test_unset_arguments_keep_their_values(tape: Tape) -> None:
    configure(include=["verl"])
    configure(enabled=True)
    assert current_backend() is tape and not is_active()


def test_reset_forgets_configure() -> None:
    configure(backend="record", include=["verl"])
    settings.reset()
    assert current_backend().name == "noop"  # auto, and no torch_npu/CUDA here


# --- ranks ----------------------------------------------------------------------------------------


def test_ranks_use_the_rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    configure(backend="record", ranks=[3])
    assert is_active()
    configure(ranks=[0, 1])
    assert not is_active()
    configure(ranks=[])  # all ranks
    assert is_active()


def test_rank_defaults_to_zero_without_env_or_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    configure(backend="record", ranks=[0])
    assert is_active()
    configure(ranks=[1])
    assert not is_active()


def test_rank_from_initialised_torch_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True  # type: ignore[attr-defined]
    dist.is_initialized = lambda: True  # type: ignore[attr-defined]
    dist.get_rank = lambda: 2  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    configure(backend="record", ranks=[2])
    assert is_active()
    configure(ranks=[0])
    assert not is_active()


def test_rank_from_env_when_distributed_not_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True  # type: ignore[attr-defined]
    dist.is_initialized = lambda: False  # type: ignore[attr-defined]
    dist.get_rank = lambda: pytest.fail("get_rank called while not initialised")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    monkeypatch.setenv("RANK", "5")
    configure(backend="record", ranks=[5])
    assert is_active()


# --- environment ----------------------------------------------------------------------------------


def test_env_backend_and_disable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSTX_MARKS_BACKEND", " Record ")
    assert current_backend().name == "record" and is_active()
    settings.reset()
    monkeypatch.setenv("MSTX_MARKS_DISABLE", "1")
    assert current_backend().name == "record" and not is_active()


@pytest.mark.parametrize(
    ("var", "value", "active", "inactive"),
    [
        ("MSTX_MARKS_INCLUDE", "verl, vllm", ["verl", "vllm"], ["default", "other"]),
        ("MSTX_MARKS_EXCLUDE", "default,verl", ["other"], ["default", "verl"]),
    ],
)
def test_env_domain_filters(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, active: list[str], inactive: list[str]
) -> None:
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    monkeypatch.setenv(var, value)
    assert all(is_active(d) for d in active)
    assert not any(is_active(d) for d in inactive)


def test_env_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    monkeypatch.setenv("MSTX_MARKS_RANKS", "1,2")
    monkeypatch.setenv("RANK", "2")
    assert is_active()
    settings.reset()
    monkeypatch.setenv("RANK", "0")
    assert not is_active()


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("MSTX_MARKS_BACKEND", "cuda"),
        ("MSTX_MARKS_INCLUDE", "bad-domain"),
        ("MSTX_MARKS_RANKS", "zero"),
        ("MSTX_MARKS_RANKS", "-1"),
    ],
)
def test_bad_env_values_warn_and_are_ignored(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    if var != "MSTX_MARKS_BACKEND":
        monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    monkeypatch.setenv(var, value)
    with caught() as w:
        active = is_active()
        is_active("other")
    assert len(w) == 1 and var in str(w[0].message) and repr(value) in str(w[0].message)
    assert active == (var != "MSTX_MARKS_BACKEND")


def test_env_include_and_exclude_warn_and_include_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    monkeypatch.setenv("MSTX_MARKS_INCLUDE", "verl")
    monkeypatch.setenv("MSTX_MARKS_EXCLUDE", "verl")
    with caught() as w:
        assert is_active("verl") and not is_active("other")
    assert len(w) == 1 and "include wins" in str(w[0].message)


def test_configure_overrides_env(monkeypatch: pytest.MonkeyPatch, tape: Tape) -> None:
    settings.reset()
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "noop")
    monkeypatch.setenv("MSTX_MARKS_DISABLE", "1")
    monkeypatch.setenv("MSTX_MARKS_INCLUDE", "verl")
    configure(backend=tape, enabled=True)
    assert current_backend() is tape
    assert is_active("verl") and not is_active()  # env include kept: not overridden
    configure(exclude=["verl"])
    assert is_active() and not is_active("verl")


def test_env_is_read_once_until_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "record")
    assert is_active()
    monkeypatch.setenv("MSTX_MARKS_DISABLE", "1")
    assert is_active()
    settings.reset()
    assert not is_active()


def test_settings_resolve_lazily_not_when_marks_are_made() -> None:
    @mstx_marks.mstx_range("lazy")
    def f() -> int:
        return 1

    mark("m")
    assert not PROCESS.settings.resolved and backends._detected is None
    assert f() == 1
    assert PROCESS.settings.resolved and backends._detected is not None


def test_env_read_at_first_use_not_at_import() -> None:
    script = textwrap.dedent(
        """
        import os
        import mstx_marks
        from mstx_marks import mark, mstx_range

        @mstx_range("decorated_at_import", domain="verl")
        def f():
            return 1

        m = mark("made_at_import")
        os.environ["MSTX_MARKS_BACKEND"] = "record"
        os.environ["MSTX_MARKS_EXCLUDE"] = "other"
        f()
        with m:
            pass
        with mark("excluded", domain="other"):
            pass
        os.environ["MSTX_MARKS_DISABLE"] = "1"  # after first use: no effect
        f()
        rec = mstx_marks.default_recorder()
        print(sorted((r.name, r.domain) for r in rec.records()))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(
        [
            ("decorated_at_import", "verl"),
            ("decorated_at_import", "verl"),
            ("made_at_import", "default"),
        ]
    )


# --- a known backend that cannot work here --------------------------------------------------------


def _cuda_available() -> bool:
    try:
        import torch
    except Exception:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(_cuda_available(), reason="CUDA is available: nvtx works here")
def test_nvtx_without_cuda_warns_once_and_falls_back_to_noop(tape: Tape) -> None:
    with caught() as w:
        configure(backend="nvtx")
        configure(backend="nvtx", enabled=True)
        configure(include=["verl"])
        with mark("x"):
            pass
    assert len(w) == 1 and "'nvtx'" in str(w[0].message)
    assert current_backend().name == "noop" and not is_active("verl")
    assert not tape.ranges


@pytest.mark.skipif(_cuda_available(), reason="CUDA is available: nvtx works here")
def test_nvtx_from_env_without_cuda_warns_once_at_first_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "nvtx")

    @mstx_marks.mstx_range("f")
    def f() -> int:
        return 4

    with caught() as w:
        assert [f(), f()] == [4, 4]
    assert len(w) == 1 and "'nvtx'" in str(w[0].message)
    assert current_backend().name == "noop"


def test_mstx_without_torch_npu_warns_and_falls_back_to_noop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu fails
    with caught() as w:
        configure(backend="mstx")
    assert len(w) == 1 and "torch_npu" in str(w[0].message)
    assert current_backend().name == "noop"


def test_explicit_backend_skips_auto_detection_and_env_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """configure(backend=...) must not first build the env/auto backend it replaces."""
    monkeypatch.setenv("MSTX_MARKS_BACKEND", "nvtx")  # would warn here (no CUDA) if built
    with caught() as w:
        configure(backend="record")
    assert not w
    assert current_backend().name == "record"
    settings.reset()
    monkeypatch.delenv("MSTX_MARKS_BACKEND")
    configure(backend="record", include=["verl"])
    assert backends._detected is None  # auto (importing torch_npu) never ran
