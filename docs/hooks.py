"""MkDocs hooks: the pages generated from the code, at build time (their one home is the code).

A page asks for a generated block with an HTML comment on a line of its own:

- ``<!-- generated: environment -->``: :func:`mstx_marks.base.env.markdown_table`;
- ``<!-- generated: cli -->``: :func:`mstx_marks.cli.main.markdown_reference`, from the parser;
- ``<!-- generated: compatibility -->``: the presets' own ``versions`` rows
  (:data:`mstx_marks.capture.presets.TARGETS`);
- ``<!-- generated: presets -->``: what each preset marks, from what its module declares
  (:data:`mstx_marks.capture.presets.PRESETS`);
- ``<!-- generated: recipes -->`` and ``<!-- generated: phases -->``: what ``mstx-marks
  recipes`` and ``mstx-marks phases`` print.

``tests/test_docs.py`` checks each of them without MkDocs, and builds the site strictly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

#: A generated block: its start marker, what was generated last, its end marker. The block is
#: kept in the page so that a reader of the markdown (GitHub's view) sees it too;
#: ``python3 docs/hooks.py`` writes it afresh, and ``tests/test_docs.py`` fails when it is stale.
MARKER = re.compile(r"^<!-- generated: ([a-z]+) -->\n(?:.*?^<!-- end generated -->$|)", re.M | re.S)
END = "<!-- end generated -->"


def environment() -> str:
    import mstx_marks.capture.presets  # noqa: F401  (it declares the preset names listed)
    from mstx_marks.base import env

    return env.markdown_table()


def cli() -> str:
    from mstx_marks.cli.main import markdown_reference

    return markdown_reference()


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def compatibility() -> str:
    """One row per preset and version range: where it patches, and the ranges it emits."""
    from mstx_marks.capture.presets import FRAMEWORKS, TARGETS

    rows: dict[tuple[str, str], tuple[dict[str, list[str]], list[str]]] = {}
    for t in TARGETS:
        places, phases = rows.setdefault((t.framework, t.versions), ({}, []))
        paths = places.setdefault(t.module, [])
        if t.path not in paths:
            paths.append(t.path)
        if t.phase not in phases:
            phases.append(t.phase)
    order = {name: i for i, name in enumerate(FRAMEWORKS)}
    lines = [
        "| preset | versions | where it patches | ranges |",
        "|---|---|---|---|",
    ]
    for (framework, versions), (places, phases) in sorted(
        rows.items(), key=lambda item: order.get(item[0][0], len(order))
    ):
        lines.append(
            f"| `{framework}` | {_cell(versions)} | "
            + "<br>".join(
                f"`{module}`: " + ", ".join(f"`{_cell(p)}`" for p in paths)
                for module, paths in places.items()
            )
            + " "
            f"| {', '.join(f'`{p}`' for p in phases)} |"
        )
    return "\n".join(lines)


def _by_version(versions: str) -> tuple[str, tuple[int, ...], str]:
    """A ``versions`` text's sort key: the product named before the first number, the number."""
    found = re.search(r"\d+(?:\.\d+)*", versions)
    if found is None:
        return versions, (), versions
    number = tuple(int(part) for part in found.group().split("."))
    return versions[: found.start()], number, versions


def presets() -> str:
    """One row per preset: the versions its targets were read from (their ``versions``, the
    compatibility matrix's one table), and its own summary of where it patches and what it
    emits, else its targets' paths and phases."""
    from mstx_marks.capture.presets import PRESETS, targets

    lines = ["| preset | versions | where | ranges |", "|---|---|---|---|"]
    for p in PRESETS:
        rows = targets(p.name)
        versions = "; ".join(sorted(dict.fromkeys(t.versions for t in rows), key=_by_version))
        where = p.where or ", ".join(dict.fromkeys(f"`{t.path}`" for t in rows))
        ranges = p.ranges or ", ".join(dict.fromkeys(f"`{t.phase}`" for t in rows))
        aliases = ", ".join(f"`{a}`" for a in p.aliases)
        name = f"`{p.name}`" + (f" (alias {aliases})" if aliases else "")
        lines.append(f"| {name} | {_cell(versions)} | {_cell(where)} | {_cell(ranges)} |")
    return "\n".join(lines)


def recipes() -> str:
    from mstx_marks.profiling.recipes import recipes_table

    return "```text\n" + recipes_table() + "\n```"


def phases() -> str:
    import mstx_marks.capture.presets  # noqa: F401  (it registers the presets' own phases)
    from mstx_marks.base.phases import phases_table

    return "```text\n" + phases_table() + "\n```"


GENERATORS: dict[str, Callable[[], str]] = {
    "environment": environment,
    "cli": cli,
    "compatibility": compatibility,
    "presets": presets,
    "recipes": recipes,
    "phases": phases,
}


def expand(markdown: str) -> str:
    """``markdown`` with every generated block filled in; an unknown name is an error."""

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated block {name!r}; known: {', '.join(GENERATORS)}")
        return f"<!-- generated: {name} -->\n\n{GENERATORS[name]()}\n\n{END}"

    return MARKER.sub(fill, markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return expand(markdown)


def rewrite(docs: Path, *, check: bool = False) -> list[Path]:
    """Write every page's generated blocks afresh (``check``: only look); the pages that
    changed (or would)."""
    changed = []
    for page in sorted(docs.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        fresh = expand(text)
        if fresh != text:
            if not check:
                page.write_text(fresh, encoding="utf-8")
            changed.append(page)
    return changed


if __name__ == "__main__":  # python3 docs/hooks.py [--check]: refresh (or check) the blocks
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    check = "--check" in sys.argv[1:]
    stale = rewrite(Path(__file__).resolve().parent, check=check)
    for page in stale:
        print(f"{'stale' if check else 'rewrote'}: {page} (python3 docs/hooks.py rewrites it)")
    sys.exit(1 if check and stale else 0)
