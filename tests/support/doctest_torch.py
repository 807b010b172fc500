"""A pytest plugin (``-p support.doctest_torch``, in pyproject's addopts): doctest examples that
build a real profiler need torch, an optional dependency; where torch does not import they are
skipped rather than failed, so ``pytest mstx_marks`` is green with the standard library only.

A plugin, not a ``conftest.py`` at the top of the repository: that one would shadow
``tests/conftest.py`` for ``from conftest import ...`` in spawned children."""

from __future__ import annotations

import pytest

NEEDS_TORCH = {
    "mstx_marks.capture.nn_modules",
    "mstx_marks.profiling.profiler.build_profiler",
    "mstx_marks.profiling.profiler.capture_steps",
    "mstx_marks.profiling.profiler.profiler_schedule",
}


def _torch_imports() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


#: Modules that import torch at the top (the demo's model): not collected where torch is missing.
TORCH_MODULES = {"demo_model.py"}


def pytest_ignore_collect(collection_path: object, config: pytest.Config) -> bool | None:
    if getattr(collection_path, "name", None) in TORCH_MODULES and not _torch_imports():
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _torch_imports():
        return
    skip = pytest.mark.skip(reason="this example builds a torch profiler; torch does not import")
    for item in items:
        if item.name in NEEDS_TORCH:
            item.add_marker(skip)
