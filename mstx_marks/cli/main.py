"""``mstx-marks COMMAND ...`` (also ``python -m mstx_marks``): the whole command line.

Every command's options are declared here, each with its help text, and argparse's exits are
handled in one place (:func:`main` returns the exit code; nothing here calls ``sys.exit``). The
work is done by the library functions each command calls, imported only when it runs, so
``import mstx_marks`` imports neither argparse nor any command's dependencies.

>>> main(["--version"])  # doctest: +ELLIPSIS
mstx-marks ...
0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from typing import Any, Callable, NoReturn

__all__ = ["COMMANDS", "main", "markdown_reference"]

PROG = "mstx-marks"


class _Exit(Exception):
    """argparse wanted to exit: its status and what it printed go back through :func:`main`."""

    def __init__(self, status: int, message: str | None) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class _Parser(argparse.ArgumentParser):
    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _Exit(status, message)

    def error(self, message: str) -> NoReturn:
        raise _Exit(2, f"{self.format_usage()}{self.prog}: error: {message}\n")


def _csv_ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated ints") from None


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


# --- commands: each declares its options and calls the library ---------------------------------


def _phases_args(p: argparse.ArgumentParser) -> None:
    del p  # no options


def _phases(args: argparse.Namespace) -> int:
    from mstx_marks.base.phases import phases_table

    print(phases_table())
    return 0


def _recipes_args(p: argparse.ArgumentParser) -> None:
    del p


def _recipes(args: argparse.Namespace) -> int:
    from mstx_marks.profiling.recipes import recipes_table

    print(recipes_table())
    return 0


def _verl_overrides_args(p: argparse.ArgumentParser) -> None:
    from mstx_marks.profiling.options import CONTENTS, LEVELS
    from mstx_marks.profiling.verl_config import ENGINES, ROLES

    p.add_argument("--steps", type=_csv_ints, required=True, help="steps to profile, e.g. 1,2,5")
    p.add_argument("--save-path", default="outputs/profile", help="global_profiler.save_path")
    p.add_argument(
        "--roles",
        type=_csv,
        default=["actor", "ref", "rollout"],
        help="comma-separated roles to profile: " + ",".join(ROLES),
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument(
        "--ranks",
        type=_csv_ints,
        help="global ranks, e.g. 0,8 (rollout: replica ranks; default: 0)",
    )
    who.add_argument("--all-ranks", action="store_true", help="profile every rank")
    p.add_argument("--level", help="profiler level: " + ", ".join(LEVELS))
    p.add_argument(
        "--contents",
        type=_csv,
        help="what to collect: " + ",".join(CONTENTS) + " (from verl 0.9.1 list npu for MSTX)",
    )
    p.add_argument(
        "--discrete",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one capture per stage (rollout needs it)",
    )
    p.add_argument(
        "--analysis",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="parse the capture when it ends",
    )
    p.add_argument(
        "--token-window", type=_csv_ints, metavar="START,STOP", help="rollout tokens to profile"
    )
    p.add_argument("--tool", default="npu", help="global_profiler.tool (default npu)")
    p.add_argument("--engine", help="rollout engine: " + ", ".join(ENGINES))
    p.add_argument("--continuous", action="store_true", help="profile_continuous_steps")
    p.add_argument("--raw", action="store_true", help="print Hydra strings without shell quoting")


def _verl_overrides(args: argparse.Namespace) -> int:
    from mstx_marks.profiling.verl_config import verl_overrides

    window = None
    if args.token_window is not None:
        if len(args.token_window) != 2:
            print(f"error: --token-window {args.token_window} must be START,STOP", file=sys.stderr)
            return 2
        window = (args.token_window[0], args.token_window[1])
    lines = verl_overrides(
        steps=args.steps,
        save_path=args.save_path,
        roles=args.roles,
        ranks=args.ranks,
        all_ranks=args.all_ranks,
        level=args.level,
        contents=args.contents,
        discrete=args.discrete,
        analysis=args.analysis,
        token_window=window,
        tool=args.tool,
        engine=args.engine,
        continuous=args.continuous,
    )
    for line in lines:
        print(line if args.raw else shlex.quote(line))
    return 0


def _check_verl_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", help="launch script paths, '-' for stdin, or key=value")


def _check_verl(args: argparse.Namespace) -> int:
    from mstx_marks.cli.doctor import check_values
    from mstx_marks.profiling.verl_config import check_verl_inputs

    def check_env(values: dict[str, str]) -> list[str]:
        return [f"{f.topic}: {f.text}" for f in check_values(values)]

    return check_verl_inputs(args.inputs, check_env)


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--instrument", metavar="LIST", help="MSTX_MARKS_INSTRUMENT, e.g. verl,vllm")
    p.add_argument("--out", metavar="DIR", help="MSTX_MARKS_OUT: every process records there")
    p.add_argument("--sample", metavar="SPEC", help="MSTX_MARKS_SAMPLE, e.g. 'gen=every(2)'")
    p.add_argument("--capture", metavar="SPEC", help="MSTX_MARKS_CAPTURE (see `recipes`)")
    p.add_argument("--backend", help="MSTX_MARKS_BACKEND")
    p.add_argument("--role", help="MSTX_MARKS_ROLE of the command's processes")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS... (the job to run)")


def _run(args: argparse.Namespace) -> int:
    from mstx_marks.base import env
    from mstx_marks.launch.launcher import CannotRun, run

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print(f"error: no command given: {PROG} run [OPTIONS] -- CMD ARGS...", file=sys.stderr)
        return 2
    chosen = {
        env.INSTRUMENT: args.instrument,
        env.OUT: args.out and os.path.abspath(args.out),
        env.SAMPLE: args.sample,
        env.CAPTURE: args.capture,
        env.BACKEND: args.backend,
        env.ROLE: args.role,
    }
    given = {k: v for k, v in chosen.items() if v}
    from mstx_marks.cli.doctor import check_values

    refused = check_values(given)
    for finding in refused:
        text = finding.text.removesuffix(" (the run would ignore it)").replace("ignoring ", "", 1)
        print(f"error: {text}", file=sys.stderr)
    if refused:
        print(f"error: nothing was started: {PROG} run refuses what the job would ignore",
              file=sys.stderr)  # fmt: skip
        return 2
    out = given.get(env.OUT) or env.text(env.OUT)
    if out is not None:
        from mstx_marks.export.out import cannot_write

        # Said now, not by every process of the job hours later when it first writes.
        problem = cannot_write(out)
        if problem:
            print(f"error: nothing was started: {problem}", file=sys.stderr)
            return 2
    try:
        run(command, given)  # replaces this process: returns never
    except CannotRun as exc:  # one line and the shell's status, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return exc.code


def _coverage_args(p: argparse.ArgumentParser) -> None:
    from mstx_marks.analysis.model.coverage import EXPECTATIONS

    p.add_argument("path", help="a folder of traces (MSTX_MARKS_OUT, the demo's, a capture)")
    p.add_argument(
        "--expect",
        required=True,
        metavar="SPEC",
        help="the phases a healthy run emits: one of " + ", ".join(EXPECTATIONS)
        + ", a comma list of phase names, or a+b mixes (e.g. verl-grpo+vllm)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="the report as JSON (for CI)")
    _ray_arg(p)


def _ray_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="read PATH on every node of this Ray cluster (auto, HOST:PORT), each with a task on"
        " that node; {node_id}, {node_ip} and {host} in PATH become each node's own",
    )


@contextlib.contextmanager
def _reader(address: str | None) -> Iterator[Any]:
    """The reader of ``--ray ADDRESS``, connected while the block runs (None without it)."""
    if address is None:
        yield None
        return
    from mstx_marks.analysis.readers.cluster import ClusterError, RayReader

    try:
        reader = RayReader(address)
    except ClusterError as e:
        raise _Exit(2, f"error: {e}\n") from e
    with reader:
        yield reader


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="an MSTX_MARKS_OUT folder, once the job has ended")
    p.add_argument("--all", action="store_true", help="rewrite every process's files")


def _export(args: argparse.Namespace) -> int:
    """The files written on stdout; on stderr, one line per spill not exported (``error:``)
    or per thing left alone (``note:``: an empty spill, a link under PATH, never followed),
    then the count. Exit status 2 when a process with events got no files, else 0."""
    from mstx_marks.base.diagnostics import counted
    from mstx_marks.export.from_spills import Problem, export_spills, unexported

    if not os.path.isdir(args.path):
        raise _Exit(2, f"error: {args.path} is not a folder\n")
    problems: list[Problem] = []
    try:
        todo = len(unexported(args.path))
        written = export_spills(args.path, every=args.all, problems=problems)
    except OSError as e:  # PATH itself unreadable: one line, not a traceback
        where = f"{e.filename}: " if e.filename else ""
        raise _Exit(2, f"error: {where}{e.strerror or e}\n") from e
    for path in written:
        print(path)
    for problem in problems:
        print(f"{'error' if problem.failed else 'note'}: {problem.text}", file=sys.stderr)
    done = counted(len(written) // 2, "process", "processes")
    print(f"{done} exported ({todo} had only a spill)", file=sys.stderr)
    return 2 if any(p.failed for p in problems) else 0


def _check_expectation(spec: str) -> str | None:
    """Why ``spec`` is not what the user meant, or None: a single word that is neither a named
    expectation nor a phase of the registry is a typo (``verl-gpro``), not a phase name; a
    phase outside the registry is written with a comma (``my_phase,``)."""
    import difflib

    from mstx_marks.analysis.model.coverage import EXPECTATIONS
    from mstx_marks.base.phases import canonical

    for part in (p.strip() for p in spec.split("+")):
        if not part or "," in part or part in EXPECTATIONS:
            continue
        try:
            canonical(part)
            continue
        except KeyError:
            pass
        close = difflib.get_close_matches(part, list(EXPECTATIONS), n=1, cutoff=0.6)
        if close or "-" in part:
            hint = f"did you mean {close[0]!r}? " if close else ""
            return (
                f"--expect {part!r} is no expectation ({', '.join(EXPECTATIONS)}) and no phase of"
                f" the registry; {hint}a phase of your own is written with a comma: {part},"
            )
    return None


def _coverage(args: argparse.Namespace) -> int:
    from mstx_marks.analysis.model.coverage import check_coverage, expected_phases
    from mstx_marks.analysis.summary import load_traces

    problem = _check_expectation(args.expect)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    expected = expected_phases(args.expect)
    if args.ray:
        report, errors = _coverage_on_nodes(args.path, args.ray, expected)
    else:
        traces, errors, _ = load_traces(args.path)
        report = check_coverage(traces, expected) if traces else None
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if report is None:
        if not errors:
            print(f"error: {args.path}: no trace with any range found", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print("\n".join(report.lines()))
    return 0 if report.ok else 1


def _coverage_on_nodes(path: str, address: str, expected: list[str]) -> tuple[Any, list[str]]:
    """Coverage of the summary's parts of ``path`` read on every node (``coverage --ray``):
    ``(report or None when nothing was read, errors)``; the nodes read go to stderr."""
    from mstx_marks.analysis.model.coverage import check_parts
    from mstx_marks.analysis.summary import member_parts

    with _reader(address) as reader:
        parts, errors, _, _ = member_parts(path, progress=False, reader=reader)
        print(f"note: {reader.report(path)}", file=sys.stderr)
    return (check_parts(parts, expected) if parts else None), errors


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, default=2, help="processes (default 2)")
    p.add_argument("--steps", type=int, default=4, help="training steps (default 4)")
    p.add_argument("--tokens", type=int, default=16, help="tokens decoded per rollout (default 16)")
    p.add_argument("--out", default="demo-out", help="output folder (default demo-out)")
    p.add_argument(
        "--timeout", type=float, default=300, help="seconds before giving up (default 300)"
    )
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # one rank's run


def _demo(args: argparse.Namespace) -> int:
    from mstx_marks.cli.demo import DemoOptions, run_demo

    return run_demo(
        DemoOptions(args.ranks, args.steps, args.tokens, args.out, args.timeout, args.worker)
    )


def _summary_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a trace file, or a folder searched for them")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV instead of the table")
    fmt.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--svg", metavar="FILE", help="also draw the timeline as SVG to FILE")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report to FILE")
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="also write the whole job as one Chrome/Perfetto trace to FILE",
    )
    from mstx_marks.analysis.model.steps import default_steps  # (small: the phase registry alone)

    p.add_argument(
        "--step-name",
        metavar="PHASE",
        help=f"the phase whose ranges are steps (default: {default_steps()})",
    )
    p.add_argument(
        "--step-key",
        metavar="KEY",
        default="step",
        help="the range args entry that numbers a step, e.g. global_step, weight_version, "
        "rollout_id; ranges sharing it are one step (default: step)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="worker processes reading files (default: one per CPU)",
    )
    p.add_argument(
        "--run",
        dest="run_id",  # `run` is the sub-command's function
        metavar="ID|all",
        help="which run of the job to read when several wrote into the folder (default: the "
        "newest, named on stderr)",
    )
    p.add_argument(
        "--all-phases",
        action="store_true",
        help="list every phase in the table, the HTML report and the SVG legend (default: each "
        "role's 200 of most time, the rest as one counted row; --json and --csv hold every one)",
    )
    p.add_argument(
        "--no-per-step",
        action="store_true",
        help="leave out where each step's time goes per process (the per-step table, its JSON)",
    )
    _ray_arg(p)


def _summary(args: argparse.Namespace) -> int:
    from mstx_marks.analysis.model.steps import StepOptions
    from mstx_marks.analysis.summary import run_summary

    if args.jobs is not None and args.jobs < 1:
        print(f"error: --jobs {args.jobs}: must be at least 1", file=sys.stderr)
        return 2
    if not args.ray:
        _say_unexported(args.path)
    with _reader(args.ray) as reader:
        return run_summary(
            args.path,
            "csv" if args.csv else "json" if args.json else "table",
            args.svg,
            html=args.html,
            trace=args.trace,
            steps=StepOptions(args.step_name, args.step_key, per_step=not args.no_per_step),
            jobs=args.jobs,
            run=args.run_id,
            all_phases=args.all_phases,
            reader=reader,
        )


def _diff_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", help="the base run's folder of traces")
    p.add_argument(
        "new",
        nargs="?",
        help="the new run's folder (default: BASE again: two of its runs, --base-run and"
        " --new-run, each the newest when not named; neither named: its two newest, the older"
        " as the base)",
    )
    p.add_argument(
        "--base-run",
        metavar="ID",
        help="which run of BASE (default: the newest; with NEW and --new-run not given, the one"
        " before it)",
    )
    p.add_argument("--new-run", metavar="ID", help="which run of NEW (default: the newest)")
    p.add_argument(
        "--threshold",
        type=_threshold,
        metavar="PCT",
        help="exit 1 when a role's phase grew per step by more than its noise band plus PCT %% of"
        " the base (for CI; a finite number, 0 or more)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--step-name", metavar="PHASE", help="the phase whose ranges are steps")
    p.add_argument("--step-key", metavar="KEY", default="step", help="as summary's (default: step)")
    p.add_argument("--jobs", type=int, metavar="N", help="worker processes reading files")
    _ray_arg(p)


def _threshold(text: str) -> float:
    """``--threshold``'s value, refused while the arguments are read (a NaN never fires)."""
    from mstx_marks.analysis.diff import parse_threshold

    try:
        return parse_threshold(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--threshold ")) from None


def _diff(args: argparse.Namespace) -> int:
    from mstx_marks.analysis.diff import run_diff
    from mstx_marks.analysis.model.steps import StepOptions

    if args.jobs is not None and args.jobs < 1:
        print(f"error: --jobs {args.jobs}: must be at least 1", file=sys.stderr)
        return 2
    with _reader(args.ray) as reader:
        return run_diff(
            args.base,
            args.new,
            base_run=args.base_run,
            new_run=args.new_run,
            threshold_pct=args.threshold,
            as_json=args.json,
            steps=StepOptions(args.step_name, args.step_key),
            jobs=args.jobs,
            reader=reader,
        )


def _say_unexported(path: str) -> None:
    """A note when processes of the run left only their spill (ended by a signal, as Ray ends
    its workers): the summary reads them, the profilers' viewers need their exports."""
    from mstx_marks.base.diagnostics import counted
    from mstx_marks.export.from_spills import unexported

    if not os.path.isdir(path):
        return
    left = unexported(path)
    if left:
        print(
            f"note: {counted(len(left), 'process', 'processes')} left only a spill (ended by a"
            " signal: Ray ends its workers so); this summary reads it. For MindStudio Insight,"
            f" msprof-analyze and Perfetto: {PROG} export {shlex.quote(path)}",
            file=sys.stderr,
        )


def _doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        help="a torch_npu dynamic-profiling profiler_config.json (or its folder) to check too",
    )
    p.add_argument("--json", action="store_true", help="print the findings as JSON")


def _doctor(args: argparse.Namespace) -> int:
    from mstx_marks.cli.doctor import run_doctor

    return run_doctor(args.config, as_json=args.json)


Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]

#: name -> (declare options, run, one-line help)
COMMANDS: dict[str, Command] = {
    "demo": (_demo_args, _demo, "run the multi-rank GRPO-shaped demo on CPU"),
    "summary": (_summary_args, _summary, "per-phase summary of traces (--html, --svg, --json)"),
    "diff": (_diff_args, _diff, "two runs side by side: each role's phases per step, with noise"),
    "run": (_run_args, _run, "run a command with every Python process under it activated"),
    "recipes": (_recipes_args, _recipes, "list the profiler capture recipes"),
    "doctor": (_doctor_args, _doctor, "say whether ranges would reach the profiler here, and why"),
    "coverage": (_coverage_args, _coverage, "list expected phases a run never emitted"),
    "export": (_export_args, _export, "write the files of processes that left only a spill"),
    "phases": (_phases_args, _phases, "print the registry of standard RL phases"),
    "verl-overrides": (_verl_overrides_args, _verl_overrides, "print verl profiler overrides"),
    "check-verl": (_check_verl_args, _check_verl, "check verl profiler overrides"),
}


def _parser() -> _Parser:
    from mstx_marks.base import VERSION

    parser = _Parser(
        prog=PROG,
        description="Mark RL training phases as MSTX ranges; inspect and analyse them.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (declare, run, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".")
        declare(p)
        p.set_defaults(run=run)
    return parser


def markdown_reference(width: int = 100) -> str:
    """The command line's reference page, from the parser itself: each command's one-line help
    and its ``--help`` text at ``width`` columns (the documentation site's CLI page).

    >>> "## `mstx-marks doctor`" in markdown_reference()
    True
    """
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)  # argparse wraps at the terminal's width
    try:
        parser = _parser()
        parts = [
            f"`{PROG}` (also `python -m mstx_marks`) runs one command; exit status 2 is a usage"
            " error. Every option, as `--help` prints it:",
            "```text\n" + parser.format_help().rstrip() + "\n```",
        ]
        for name, (declare, _, help_) in COMMANDS.items():
            sub = _Parser(prog=f"{PROG} {name}", description=help_[0].upper() + help_[1:] + ".")
            declare(sub)
            parts += [f"## `{PROG} {name}`", help_[0].upper() + help_[1:] + ".",
                      "```text\n" + sub.format_help().rstrip() + "\n```"]  # fmt: skip
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    return "\n\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (2 for usage errors, as argparse says)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        args: Any = parser.parse_args(args_list)
        if args.command is None:
            parser.print_usage(sys.stderr)
            print(f"{PROG}: error: a command is needed; see '{PROG} --help'", file=sys.stderr)
            return 2
        return int(args.run(args))
    except _Exit as exit_:
        if exit_.message:
            (sys.stderr if exit_.status else sys.stdout).write(exit_.message)
        return exit_.status
    except (TypeError, ValueError) as err:  # a library function refused a value: say which
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, as Unix tools do. Pointing stdout at
        # devnull keeps the interpreter's final flush from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
