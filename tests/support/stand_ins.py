"""Stand-in modules for tests that must not import a real framework: each named module (and its
parents) exists in sys.modules for the test only, holding what the test gives it."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest


def fake_module(monkeypatch: pytest.MonkeyPatch, dotted: str, **attrs: Any) -> types.ModuleType:
    """Put ``dotted`` in sys.modules with ``attrs``; fake parents keep the real package away."""
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        if not getattr(sys.modules.get(parent), "__fake__", False):
            stub = types.ModuleType(parent)
            stub.__fake__ = True  # type: ignore[attr-defined]
            monkeypatch.setitem(sys.modules, parent, stub)
    module = types.ModuleType(dotted)
    module.__fake__ = True  # type: ignore[attr-defined]
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, dotted, module)
    return module
