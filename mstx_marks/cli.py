"""``python -m mstx_marks COMMAND ...``: the command line.

Each command lives with the feature it serves and is imported only when chosen, so
``python -m mstx_marks phases`` never imports torch.

>>> main(["--help"])  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Callable

__all__ = ["main"]

#: command -> (module, function taking argv and returning an exit code, one-line help)
COMMANDS = {
    "demo": ("mstx_marks.demo", "demo_cli", "run the multi-rank GRPO-shaped demo on CPU"),
    "summary": ("mstx_marks.summary", "summary_cli", "per-phase summary of traces (--svg, --csv)"),
    "phases": ("mstx_marks.phases", "phases_cli", "print the registry of standard RL phases"),
    "verl-overrides": ("mstx_marks.verl", "verl_overrides_cli", "print verl profiler overrides"),
    "check-verl": ("mstx_marks.verl", "check_verl_cli", "check verl profiler overrides"),
}


def _usage() -> str:
    lines = ["usage: python -m mstx_marks COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<16}{help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines.append("\n'python -m mstx_marks COMMAND --help' describes each command.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code (2 for an unknown command)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    entry = COMMANDS.get(args[0])
    if entry is None:
        print(f"error: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func, _ = entry
    command: Callable[[list[str]], int] = getattr(importlib.import_module(module), func)
    try:
        return command(args[1:])
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, as Unix tools do. Pointing stdout at
        # devnull keeps the interpreter's final flush from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
