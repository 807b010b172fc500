"""Run the fenced blocks of a markdown page with Sybil (tests/test_doc_snippets.py runs every page).

Sybil's lexer finds the blocks; what each one does depends on its fence and first line:

- ```` ```python ````: runs in this process, in one namespace per page (Sybil's evaluator), so a
  block may use what an earlier block of its page defined;
- ```` ```bash ````: runs in ``bash -eu -o pipefail`` in the current folder; a non-zero exit fails;
- ```` ```console ````: a transcript: each ``$ command`` runs in bash (``\\`` continues it), and
  what it prints, stdout and stderr together, must match the lines below it (doctest's
  comparison, ``...`` matching anything); its exit status is not checked;
- ```` ```LANG title="NAME" ````: a file the page's later blocks use (``python train.py``):
  written as NAME in the current folder, not run (MkDocs shows NAME above the block);
- a block whose first line is ``# fragment: WHY``: shown, never run, because it needs what a
  test machine lacks (an NPU, a cluster, your model, the network); the line says so on the page;
- Sybil's ``<!-- skip: next "WHY" -->`` skips the block after it where no line can be added to
  it (README's setup and test commands, which CI runs verbatim);
- blocks between ``<!-- generated: x -->`` and ``<!-- end generated -->`` (docs/hooks.py writes
  them; tests/test_docs.py checks them) and blocks of any other language are not run.

Shell blocks run as on a CPU machine (``CUDA_VISIBLE_DEVICES`` empty: the transcripts are that
machine's), with this interpreter's folder first on ``PATH`` (``python``, ``mstx-marks``).
"""

from __future__ import annotations

import doctest
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import SkipTest

from sybil import Document, Example, Region
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import SkipParser
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[2]

#: The fence's info line: a language and an optional title, as pymdownx.highlight reads it.
INFO = re.compile(r'(?P<language>\w+)(?:[ \t]+title="(?P<title>[^"]+)")?[ \t]*$\n', re.M)
FRAGMENT = re.compile(r"# fragment: (?P<why>.+)")
RUN = ("python", "console", "bash", "sh")
#: One shell command's limit; the slowest block of the pages takes about a second.
TIMEOUT_S = 120


def _generated_marker() -> re.Pattern[str]:
    """docs/hooks.py's pattern for a generated block (its one home)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    marker: re.Pattern[str] = hooks.MARKER
    return marker


def shell_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _bash(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-eu", "-o", "pipefail", "-c", script],
        env=shell_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_S,
    )


def run_shell(example: Example) -> str | None:
    proc = _bash(example.parsed)
    if proc.returncode:
        return f"exit status {proc.returncode}:\n{proc.stdout}"
    return None


def transcript(text: str) -> Iterator[tuple[str, str]]:
    """Each ``$ command`` of a console block and the output shown below it."""
    command: list[str] = []
    want: list[str] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            if command:
                yield "\n".join(command), "".join(want)
            command, want = [line[2:]], []
        elif command and not want and command[-1].endswith("\\"):
            command.append(line)
        elif not command:
            raise ValueError(f"a console block starts with '$ command', not {line!r}")
        else:
            want.append(line + "\n")
    if command:
        yield "\n".join(command), "".join(want)


def run_console(example: Example) -> str | None:
    checker = doctest.OutputChecker()
    for command, want in transcript(example.parsed):
        got = _bash(command).stdout
        if not checker.check_output(want, got, doctest.ELLIPSIS):
            return checker.output_difference(doctest.Example(command, want), got, doctest.ELLIPSIS)
    return None


def write_file(example: Example) -> None:
    path = Path(example.region.lexemes["title"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(example.parsed, encoding="utf-8")


def skip(why: str) -> Callable[[Example], None]:
    def evaluate(example: Example) -> None:
        raise SkipTest(why)

    return evaluate


class Blocks:
    """A Sybil parser: every fenced block in a language of ``RUN``, with what evaluates it and
    its ``kind`` lexeme: runs, file, fragment or generated."""

    def __init__(self) -> None:
        self.lexer = RawFencedCodeBlockLexer(info_pattern=INFO)
        self.python = PythonEvaluator()
        self.generated = _generated_marker()

    def __call__(self, document: Document) -> Iterable[Region]:
        spans = [m.span() for m in self.generated.finditer(document.text)]
        for region in self.lexer(document):
            language, title = region.lexemes["language"], region.lexemes["title"]
            if language not in RUN:
                continue
            region.parsed = source = region.lexemes["source"]
            fragment = FRAGMENT.match(source)
            if any(start <= region.start < end for start, end in spans):
                kind, region.evaluator = "generated", skip("docs/hooks.py writes it")
            elif fragment:
                kind, region.evaluator = "fragment", skip(fragment.group("why"))
            elif title:
                kind, region.evaluator = "file", write_file
            elif language == "python":
                kind, region.evaluator = "runs", self.python
            else:
                kind = "runs"
                region.evaluator = run_console if language == "console" else run_shell
            region.lexemes["kind"] = kind
            yield region


def parse(path: Path) -> Document:
    return Document.parse(str(path), SkipParser(), Blocks())


@dataclass(frozen=True)
class Block:
    line: int
    language: str
    #: runs, file, fragment, generated, or "skipped: WHY" by a directive before it
    kind: str


def blocks(path: Path) -> list[Block]:
    """The page's blocks in order, without running them."""
    found: list[Block] = []
    directive: str | None = None
    for example in parse(path):
        lexemes = example.region.lexemes
        if "kind" not in lexemes:  # a skip directive: ("next", reason or None)
            directive = f"skipped: {example.parsed[1] or ''}"
            continue
        found.append(Block(example.line, lexemes["language"], directive or lexemes["kind"]))
        directive = None
    return found


@dataclass
class Outcome:
    """What became of a page's blocks: the lines of those that ran, and why the rest did not."""

    ran: list[int]
    skipped: dict[int, str]


def run_page(path: Path) -> Outcome:
    """Evaluate every block of ``path`` in order, in the current folder; the first failure
    raises (Sybil's ``SybilFailure`` for a shell block, the block's own exception for Python)."""
    outcome = Outcome([], {})
    for example in parse(path):
        try:
            example.evaluate()
        except SkipTest as why:
            outcome.skipped[example.line] = str(why)
            continue
        if "kind" in example.region.lexemes:  # not a skip directive
            outcome.ran.append(example.line)
    return outcome
