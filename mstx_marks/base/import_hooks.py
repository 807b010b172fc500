"""Run a function right after a module is imported, without importing it ourselves.

Presets must patch a framework in every process that uses it, but importing the framework just
to patch it would probe devices early (vLLM, torch_npu) or fail where it is not installed. A
post-import hook waits: when the module is already imported the function runs at once,
otherwise a finder on ``sys.meta_path`` runs it as soon as the module's code has executed, before
whoever imported it gets it back (so classes are patched before any instance exists).

>>> import sys
>>> seen = []
>>> when_imported("json.tool", lambda m: seen.append(m.__name__))
>>> import json.tool
>>> seen
['json.tool']
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Callable

from mstx_marks.base.diagnostics import warn
from mstx_marks.base.forking import new_lock

__all__ = ["when_imported"]

Hook = Callable[[ModuleType], object]

_lock = new_lock(reentrant=True)
_pending: dict[str, list[Hook]] = {}


def _run(hook: Hook, module: ModuleType) -> None:
    try:
        hook(module)
    except Exception as exc:  # a preset's failure must never break the framework's import
        warn(f"a post-import hook for {module.__name__} failed ({type(exc).__name__}: {exc})")


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders, then wraps the loader of a watched module."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        spec.loader = _Loader(loader)
        return spec


class _Loader(importlib.abc.Loader):
    """The real loader, then the hooks waiting for that module."""

    def __init__(self, real: importlib.abc.Loader) -> None:
        self._real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Put the real loader back first: reloads and pickled specs then see the ordinary one.
        if module.__spec__ is not None:
            module.__spec__.loader = self._real
        module.__loader__ = self._real
        self._real.exec_module(module)
        with _lock:
            hooks = _pending.pop(module.__name__, [])
        for hook in hooks:
            _run(hook, module)

    def __getattr__(self, name: str) -> object:  # get_source, get_code, is_package, ...
        return getattr(self._real, name)


_finder = _Finder()


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once module ``name`` is imported: now, or right after its import.

    A hook that raises is reported with one warning; the import itself always succeeds. (A
    module cannot be half-imported when a preset arms: Python imports a package's parents, the
    framework's ``__init__`` that loads our plugin included, before the module itself.)
    """
    module = sys.modules.get(name)
    if module is not None:
        _run(hook, module)
        return
    with _lock:
        _pending.setdefault(name, []).append(hook)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
