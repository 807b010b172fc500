"""A griffe extension for the API reference: the docstrings are reStructuredText-flavoured and
their examples are doctests (``pytest --doctest-modules`` runs them), so before they are rendered
as Markdown each ``>>>`` example becomes a fenced ``pycon`` block and each Sphinx role
(``:func:`~mstx_marks.mark```) a code span. The docstrings themselves stay as they are."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|meth|class|mod|data|attr|obj|exc|envvar):`~?\.?([^`]+)`")


def _role(match: re.Match[str]) -> str:
    return f"`{match.group(1)}`"


def to_markdown(text: str) -> str:
    """``text`` with doctest examples fenced and roles turned into code spans."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
            out.append(f"{indent}```")
            continue
        out.append(_ROLE.sub(_role, line))
        i += 1
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Rewrite every docstring griffe loads with :func:`to_markdown`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
