"""Post-import hooks: a hook runs once its module is imported, never imports it itself, and a
failing hook never breaks the import."""

from __future__ import annotations

import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import mstx_marks
from mstx_marks.base.import_hooks import when_imported


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real package on disk, not yet imported: ``fakefw`` with ``fakefw.workers``."""
    root = tmp_path / "fakefw"
    root.mkdir()
    (root / "__init__.py").write_text("LOADED = []\n")
    (root / "workers.py").write_text(
        textwrap.dedent(
            """
            import fakefw
            fakefw.LOADED.append("workers")

            class Worker:
                def step(self):
                    return "stepped"
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fakefw"
    for name in [m for m in sys.modules if m == "fakefw" or m.startswith("fakefw.")]:
        del sys.modules[name]


def test_hook_waits_for_the_import_and_never_imports(package: str) -> None:
    seen: list[str] = []
    when_imported("fakefw.workers", lambda m: seen.append(m.Worker().step()))
    assert "fakefw.workers" not in sys.modules and seen == []
    import fakefw.workers  # type: ignore[import-not-found]

    assert seen == ["stepped"]  # ran right after the module's code, once
    assert fakefw.LOADED == ["workers"]
    import importlib

    importlib.reload(fakefw.workers)
    assert seen == ["stepped"]  # a reload is not a first import


def test_hook_on_an_imported_module_runs_at_once(package: str) -> None:
    import fakefw.workers

    seen: list[object] = []
    when_imported("fakefw.workers", seen.append)
    assert seen == [fakefw.workers]


def test_a_failing_hook_warns_and_the_import_succeeds(package: str) -> None:
    def broken(module: object) -> None:
        raise RuntimeError("preset bug")

    when_imported("fakefw.workers", broken)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        import fakefw.workers

    assert fakefw.workers.Worker().step() == "stepped"
    assert len(w) == 1 and w[0].category is mstx_marks.MstxMarksWarning
    assert "preset bug" in str(w[0].message)


def test_the_module_spec_keeps_its_real_loader(package: str) -> None:
    when_imported("fakefw.workers", lambda m: None)
    import fakefw.workers

    assert type(fakefw.workers.__spec__.loader).__name__ == "SourceFileLoader"
    assert type(fakefw.workers.__loader__).__name__ == "SourceFileLoader"


def test_a_module_that_does_not_exist_is_not_an_error(package: str) -> None:
    when_imported("fakefw.nothing_here", lambda m: pytest.fail("never imported"))
    with pytest.raises(ModuleNotFoundError):
        import fakefw.nothing_here  # type: ignore[import-not-found]  # noqa: F401
