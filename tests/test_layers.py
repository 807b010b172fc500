"""The package imports one way: every import of every module, including those inside functions,
runs down the layers, and no modules import each other in a circle.

    base < backends < core < export < capture | analysis < profiling | live < launch < cli
    < the root

``capture`` and ``analysis`` sit side by side and never import each other; the root package
(``mstx_marks/__init__.py``, the API users import) is the top, so nothing inside imports it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mstx_marks"
ROOT = "mstx_marks"

LAYERS = {
    "base": 0,
    "backends": 1,
    "core": 2,
    "export": 3,
    "capture": 4,
    "analysis": 4,
    "profiling": 5,
    "live": 5,  # (beside profiling: the step figures a trainer logs, from the analysis)
    "launch": 6,
    "cli": 7,
}
TOP = max(LAYERS.values()) + 1


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str) -> Iterator[tuple[str, int]]:
    """(imported module of ours, line) for every import statement anywhere in ``module``, those
    inside functions included."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # `if TYPE_CHECKING:` blocks run only in the type checker: annotations may name any layer.
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node, path.name == "__init__.py")
            # `from pkg import sub` imports the submodule; `from pkg import name`, the package.
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            if name.split(".")[0] != ROOT:
                continue
            while name not in MODULES:
                name = name.rpartition(".")[0]
            if name != module:
                yield name, node.lineno


def layer(module: str) -> tuple[int, str]:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] not in LAYERS:
        return TOP, ROOT
    return LAYERS[parts[1]], parts[1]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle() -> None:
    graph = {m: {t for t, _ in imports_of(m)} for m in MODULES}
    assert _cycles(graph) == []


def test_imports_run_down_the_layers() -> None:
    wrong = []
    for module in sorted(MODULES):
        level, group = layer(module)
        for target, line in imports_of(module):
            t_level, t_group = layer(target)
            if t_group == group and group != ROOT:
                continue
            if t_level >= level:
                wrong.append(f"{module}:{line} imports {target} ({group} -> {t_group})")
    assert wrong == []


def test_the_root_holds_only_the_api_and_a_few_modules() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "__main__.py"]
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(
        LAYERS
    )


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_circle_finder_finds_circles(
    graph: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert _cycles(graph) == expected


def test_a_function_level_import_counts() -> None:
    # The old shims imported the CLI from inside functions: such an import must be seen.
    found = dict(imports_of("mstx_marks.cli.main"))
    assert any(t.startswith("mstx_marks.analysis") for t in found), found
