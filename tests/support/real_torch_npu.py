"""The real torch_npu 2.14.0 Python files (MSTX wrapper, profiler config) run over stubs.

``import torch_npu`` needs CANN, but ``npu/mstx.py`` and ``profiler/experimental_config.py`` only
need a few pure-Python siblings and a handful of C names. The wheel is fetched with pip at run time
into ``$MSTX_MARKS_TEST_CACHE`` (default ``~/.cache/mstx_marks_tests``) and only the needed ``.py``
files are extracted there; nothing from it belongs in the repository.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import types
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from support.fake_mstx_c import FakeTorchNpu
from support.torch_npu_double import install_double

VERSION = "2.14.0"
FLAVOURS = ("double", "real")
_NEEDED = (
    "torch_npu/npu/mstx.py",
    "torch_npu/_init/common/warning_utils.py",
    "torch_npu/utils/utils.py",
    "torch_npu/utils/_error_code.py",
    "torch_npu/profiler/experimental_config.py",
    "torch_npu/profiler/analysis/prof_common_func/_constant.py",
    "torch_npu/profiler/analysis/prof_common_func/_cann_package_manager.py",
)


class RealTorchNpuUnavailable(RuntimeError):
    pass


def cache_dir() -> Path:
    env = os.environ.get("MSTX_MARKS_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "mstx_marks_tests"


# A failed download is remembered so that an offline run pays pip's timeout once, not per test.
_failure: Optional[str] = None


def real_source_dir() -> Path:
    """The folder holding the extracted ``torch_npu/...`` files; downloads the wheel if needed."""
    global _failure
    root = cache_dir() / f"torch_npu-{VERSION}"
    if all((root / name).is_file() for name in _NEEDED):
        return root
    if _failure is not None:
        raise RealTorchNpuUnavailable(_failure)
    try:
        _extract(_wheel(), root)
    except (OSError, zipfile.BadZipFile, KeyError, RealTorchNpuUnavailable) as ex:
        _failure = f"real torch-npu {VERSION} files unavailable: {ex}"
        raise RealTorchNpuUnavailable(_failure) from ex
    return root


def _wheel() -> Path:
    cache = cache_dir()
    found = sorted(cache.glob(f"torch_npu-{VERSION}-*.whl"))
    if found:
        return found[0]
    # Only the .py files are used, so any interpreter may fetch the cp311 x86_64 wheel.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
           "--platform", "manylinux_2_28_x86_64", "-d", str(cache),
           f"torch-npu=={VERSION}"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = sorted(cache.glob(f"torch_npu-{VERSION}-*.whl"))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RealTorchNpuUnavailable(f"`{' '.join(cmd[1:])}` failed: {' | '.join(tail)}")
    return found[0]


def _extract(wheel: Path, root: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for name in _NEEDED:
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            # Write then rename, so parallel test workers never read half a file.
            tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
            tmp.write_bytes(zf.read(name))
            tmp.replace(target)


def require_real_torch_npu() -> Path:
    """``real_source_dir()``, or skip the test; under CI=true a missing wheel fails it instead."""
    try:
        return real_source_dir()
    except RealTorchNpuUnavailable as ex:
        if os.environ.get("CI") == "true":
            pytest.fail(str(ex), pytrace=False)
        pytest.skip(str(ex))


def _load(env: FakeTorchNpu, root: Path, name: str) -> types.ModuleType:
    """Execute the real file of module ``name``; the installed stubs satisfy its imports."""
    path = root / (name.replace(".", "/") + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    env.add(module)
    with warnings.catch_warnings():
        # Upstream regexes without raw strings warn at compile time; that is not what tests watch.
        warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
        spec.loader.exec_module(module)
    return module


def _add_utils(env: FakeTorchNpu, root: Path) -> None:
    """The real ``warning_utils`` and ``utils.utils`` (its showwarning hook stays unapplied)."""
    for name in ("torch_npu._init", "torch_npu._init.common", "torch_npu.utils"):
        env.package(name)
    _load(env, root, "torch_npu._init.common.warning_utils")
    _load(env, root, "torch_npu.utils.utils")


@contextlib.contextmanager
def install_real(npu_available: bool = True) -> Iterator[FakeTorchNpu]:
    """Like ``install_double`` but ``torch_npu.npu.mstx`` is the real file over the fake C layer.

    Skips (or fails under CI) when the wheel cannot be had.
    """
    root = require_real_torch_npu()
    env = FakeTorchNpu("real", npu_available)
    with env.installed():
        _add_utils(env, root)
        module = _load(env, root, "torch_npu.npu.mstx")
        env.torch_npu.npu.mstx = module.mstx  # type: ignore[attr-defined]
        yield env


def install(flavour: str, npu_available: bool = True) -> contextlib.AbstractContextManager[Any]:
    """``install_double`` or ``install_real`` by name, for tests parametrized over ``FLAVOURS``."""
    return {"double": install_double, "real": install_real}[flavour](npu_available)


class _ExperimentalConfigStub:
    """``torch_npu._C._profiler._ExperimentalConfig``: keeps what the Python config passes to C."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


_experimental_config: Optional[types.ModuleType] = None


def load_real_experimental_config() -> types.ModuleType:
    """The real ``torch_npu.profiler.experimental_config`` module, loaded once per process.

    Its validation prints (stdout) and warns; observe both with
    ``support.fake_mstx_c.capture_output``. Calling a config returns an ``_ExperimentalConfigStub``
    whose ``kwargs`` are what C would receive. ``sys.modules`` is left untouched.
    Skips (or fails under CI) when the wheel cannot be had.
    """
    global _experimental_config
    if _experimental_config is None:
        root = require_real_torch_npu()
        env = FakeTorchNpu("real")
        profiler_c = env.package("torch_npu._C._profiler")
        profiler_c._ExperimentalConfig = _ExperimentalConfigStub  # type: ignore[attr-defined]
        with env.installed():
            _add_utils(env, root)
            _load(env, root, "torch_npu.utils._error_code")
            for name in ("torch_npu.profiler", "torch_npu.profiler.analysis",
                         "torch_npu.profiler.analysis.prof_common_func"):  # fmt: skip
                env.package(name)
            _load(env, root, "torch_npu.profiler.analysis.prof_common_func._constant")
            _load(env, root, "torch_npu.profiler.analysis.prof_common_func._cann_package_manager")
            _experimental_config = _load(env, root, "torch_npu.profiler.experimental_config")
    return _experimental_config
