"""How long the docs' sentences are: words per sentence over the prose of README.md,
docs/*.md and docs/guides/*.md (the pages a reader reads; the reference is mostly tables and
generated text), without code blocks, tables, headings, HTML comments and generated blocks.

A sentence ends at ``.``, ``?`` or ``!`` before a space, at the end of a paragraph, and at the
end of a list item (an item without a full stop is still one). An inline code span counts as
one word, a link as its text. Prints each page's sentences, mean and 90th percentile, then the
same over all pages (the figure to compare). Run it from the repository root:

``python3 benchmarks/doc_sentences.py`` (the working tree), or
``python3 benchmarks/doc_sentences.py --rev HEAD`` (the pages as a commit holds them, read with
``git show``); ``--exclude GLOB`` (repeatable) leaves pages out, so that two revisions are
compared over the same pages; ``--json`` for programs.

>>> sentences("One two. Three `a b c` four!\\n\\n- an item\\n- [a link](x.md) here")
[['One', 'two.'], ['Three', '`code`', 'four!'], ['an', 'item'], ['a', 'link', 'here']]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/*.md", "docs/guides/*.md", "docs/explanation/*.md")

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
GENERATED = re.compile(r"<!-- generated:.*?<!-- end generated -->", re.S)
CODE = re.compile(r"`[^`\n]+`")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
#: Abbreviations whose full stop ends no sentence.
ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|etc|vs|cf)\.", re.I)
END = re.compile(r"(?<=[.?!])[\"')\]*_]*\s+")
ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")


def paragraphs(markdown: str) -> list[str]:
    """The page's prose, one string per paragraph or list item."""
    text = GENERATED.sub("", markdown)
    text = FENCE.sub("", text)
    text = COMMENT.sub("", text)
    out: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        ends = (
            not stripped
            or stripped.startswith(("#", "|", "---", "!!!", "--8<--"))
            or ITEM.match(line) is not None
        )
        if ends and current:
            out.append(" ".join(current))
            current = []
        if not stripped or stripped.startswith(("#", "|", "---", "!!!", "--8<--")):
            continue
        current.append(ITEM.sub("", line).strip())
    if current:
        out.append(" ".join(current))
    return out


def sentences(markdown: str) -> list[list[str]]:
    """The words of each sentence of the page's prose."""
    found = []
    for para in paragraphs(markdown):
        para = CODE.sub("`code`", para)
        para = LINK.sub(r"\1", para)
        para = ABBREVIATIONS.sub(r"\1", para)
        for sentence in END.split(para):
            words = [w for w in sentence.split() if re.search(r"\w", w)]
            if words:
                found.append(words)
    return found


def p90(values: list[int]) -> int:
    """The nearest-rank 90th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def pages(rev: str | None) -> dict[str, str]:
    if rev is None:
        names = sorted(p for pattern in PAGES for p in REPO.glob(pattern))
        return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in names}
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "README.md", "docs"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    wanted = [n for n in listed if any(Path(n).match(p) and n.count("/") == p.count("/")
                                       for p in PAGES)]  # fmt: skip
    return {
        n: subprocess.run(
            ["git", "show", f"{rev}:{n}"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
        for n in sorted(wanted)
    }


def figures(lengths: list[int]) -> dict[str, float]:
    if not lengths:
        return {"sentences": 0, "words": 0, "mean": 0.0, "p90": 0}
    return {
        "sentences": len(lengths),
        "words": sum(lengths),
        "mean": round(statistics.fmean(lengths), 1),
        "p90": p90(lengths),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", help="read the pages from this git revision")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                        help="leave out the pages this glob matches (repeatable)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    per_page = {
        name: [len(s) for s in sentences(text)]
        for name, text in pages(args.rev).items()
        if not any(Path(name).match(glob) for glob in args.exclude)
    }
    every = [n for lengths in per_page.values() for n in lengths]
    result = {name: figures(lengths) for name, lengths in per_page.items()}
    result["all pages"] = figures(every)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
        return 0
    print(f"{'page':36} {'sentences':>9} {'words':>6} {'mean':>6} {'p90':>4}")
    for name, f in result.items():
        print(f"{name:36} {f['sentences']:>9} {f['words']:>6} {f['mean']:>6} {f['p90']:>4}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
