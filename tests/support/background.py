"""The real engines' runs (minutes each) made in the background while the other tests run.

A run is declared where its tests are, as a fixture whose body *plans* it (finds the venv, makes
the folder) and says how to read what it left::

    @background.run(scope="module")
    def marked(tmp_path_factory: pytest.TempPathFactory) -> background.Planned[Launch]:
        where = tmp_path_factory.mktemp("marked")
        command = scenario(python, "vllm_generate.py", [...], env, timeout=300, cwd=where)
        return background.Planned([command], lambda ran: Launch(...))

At the start of the session every run that a collected test needs is planned, in the order the
tests will need them, and one runner process (``background_runner.py``) makes them one after
another: one engine at a time, beside the tests that need none, which run first (their modules
keep their order; the modules that read a run are moved after them). The fixture then waits for
its run and reads it. With ``MSTX_TEST_BACKGROUND=0``, or for a run planned late, the fixture
makes its run itself, as before.

Plans are made at the start of the session, before any test has changed the environment; a plan
that skips (its venv cannot be built) or fails says so in each test that needs the run.
A pytest plugin: tests/conftest.py names it in ``pytest_plugins``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Optional, TypeVar

import pytest

from .background_runner import run_command

T = TypeVar("T")
RUNNER = Path(__file__).resolve().with_name("background_runner.py")
OUTPUT_TAIL = 6000
WAIT_POLL_S = 0.2


@dataclass(frozen=True)
class Command:
    """One command of a run: bounded, its output kept in ``output``."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: Path
    timeout: float
    output: Path
    label: str

    def run(self) -> str:
        """Run it now; its output, or the test fails with the output's tail."""
        return run_inline([self]).output

    def as_json(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv), "env": self.env, "cwd": str(self.cwd),
            "timeout": self.timeout, "output": str(self.output),
        }  # fmt: skip


@dataclass(frozen=True)
class Ran:
    """What the last command of a run printed, and how long the run took."""

    output: str
    wall_s: float


@dataclass(frozen=True)
class Planned(Generic[T]):
    """A run's commands, and how to read the fixture's value once they all passed."""

    commands: Sequence[Command]
    read: Callable[[Ran], T]


def checked(commands: Sequence[Command], statuses: Sequence[dict[str, Any]]) -> Ran:
    """The run's output, or the failure of the command that failed, with its output's tail."""
    for command, status in zip(commands, statuses):
        if status["timed_out"] or status["returncode"] != 0:
            output = command.output.read_text(errors="replace")[-OUTPUT_TAIL:]
            why = (
                f"did not end within {command.timeout:.0f} s"
                if status["timed_out"]
                else f"exited with {status['returncode']}"
            )
            pytest.fail(f"{command.label} {why}:\n{output}")
    if len(statuses) != len(commands):
        pytest.fail(f"{commands[len(statuses)].label} never ran (the background runner stopped)")
    return Ran(commands[-1].output.read_text(errors="replace"), sum(s["wall_s"] for s in statuses))


def run_inline(commands: Sequence[Command]) -> Ran:
    """Run the commands here and now, one after another."""
    statuses = []
    for command in commands:
        statuses.append(run_command(command.as_json()))
        if statuses[-1]["returncode"] != 0:
            break
    return checked(commands, statuses)


@dataclass
class _Declared:
    name: str
    module: str
    plan: Callable[[pytest.TempPathFactory], Planned[Any]]


@dataclass
class _Outcome:
    """A run planned at the session's start: its plan, or why it has none."""

    planned: Optional[Planned[Any]] = None
    error: Optional[BaseException] = None
    status: Optional[Path] = None


_DECLARED: dict[str, _Declared] = {}


@dataclass
class _Session:
    folder: Path
    outcomes: dict[str, _Outcome] = field(default_factory=dict)
    runner: Optional[subprocess.Popen[bytes]] = None

    def wait(self, key: str) -> Ran:
        outcome = self.outcomes.pop(key)
        began = time.monotonic()
        if outcome.error is not None:
            raise outcome.error
        assert outcome.planned is not None and outcome.status is not None
        while not outcome.status.exists():
            if self.runner is not None and self.runner.poll() is not None:
                if outcome.status.exists():
                    break
                log = (self.folder / "runner.log").read_text(errors="replace")[-OUTPUT_TAIL:]
                pytest.fail(f"the background runner ended ({self.runner.returncode}):\n{log}")
            time.sleep(WAIT_POLL_S)
        statuses = json.loads(outcome.status.read_text())["ran"]
        _TALLY.append((".".join(key.split(".")[-2:]), sum(s["wall_s"] for s in statuses),
                       time.monotonic() - began))  # fmt: skip
        return checked(outcome.planned.commands, statuses)


_SESSION: Optional[_Session] = None
#: Each run read from the background: its name, how long it ran, how long its test waited.
_TALLY: list[tuple[str, float, float]] = []


def run(scope: str = "module") -> Callable[[Callable[..., Planned[T]]], Any]:
    """Declare a run: the decorated function plans it; the fixture of its name is the value its
    plan reads once the run has passed."""

    def declare(plan: Callable[[pytest.TempPathFactory], Planned[T]]) -> Any:
        key = f"{plan.__module__}.{plan.__name__}"
        _DECLARED[key] = _Declared(plan.__name__, plan.__module__, plan)

        @pytest.fixture(scope=scope, name=plan.__name__)  # type: ignore[call-overload]
        def fixture(tmp_path_factory: pytest.TempPathFactory) -> T:
            if _SESSION is not None and key in _SESSION.outcomes:
                planned = _SESSION.outcomes[key].planned
                ran = _SESSION.wait(key)
                assert planned is not None
            else:
                planned = plan(tmp_path_factory)
                ran = run_inline(planned.commands)
            return planned.read(ran)

        fixture.__doc__ = plan.__doc__
        return fixture

    return declare


def _runs_needed(item: pytest.Item) -> list[str]:
    """The runs ``item`` asks for by name: those of its own module, and of a plugin (a run that
    is asked for through ``getfixturevalue`` only is made in place, if no test names it)."""
    module = getattr(getattr(item, "module", None), "__name__", None)
    names = set(getattr(item, "fixturenames", ()))
    return [
        key
        for key, declared in _DECLARED.items()
        if declared.name in names
        and (
            declared.module == module or not declared.module.rpartition(".")[2].startswith("test_")
        )
    ]


def _enabled(config: pytest.Config) -> bool:
    return os.environ.get("MSTX_TEST_BACKGROUND", "1") != "0"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules whose tests read a run go last, in their order."""
    if not _enabled(config):
        return
    heavy = {item.path for item in items if _runs_needed(item)}
    items[:] = [i for i in items if i.path not in heavy] + [i for i in items if i.path in heavy]


@pytest.fixture(scope="session", autouse=True)
def _background_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    global _SESSION
    if not _enabled(request.config):
        yield
        return
    session = _SESSION = _Session(tmp_path_factory.mktemp("background"))
    jobs = []
    for item in request.session.items:
        for key in _runs_needed(item):
            if key in session.outcomes:
                continue
            outcome = session.outcomes[key] = _Outcome()
            try:
                outcome.planned = _DECLARED[key].plan(tmp_path_factory)
            except (Exception, pytest.skip.Exception, pytest.fail.Exception) as ex:
                outcome.error = ex
                continue
            outcome.status = session.folder / f"{len(jobs)}-{_DECLARED[key].name}.json"
            commands = [c.as_json() for c in outcome.planned.commands]
            jobs.append({"commands": commands, "status": str(outcome.status)})
    if jobs:
        plan = session.folder / "plan.json"
        plan.write_text(json.dumps({"jobs": jobs}))
        with open(session.folder / "runner.log", "wb") as log:
            session.runner = subprocess.Popen(
                [sys.executable, str(RUNNER), str(plan), str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
    try:
        yield
    finally:
        _SESSION = None
        if session.runner is not None and session.runner.poll() is None:
            session.runner.terminate()
            try:
                session.runner.wait(timeout=30)
            except subprocess.TimeoutExpired:
                session.runner.kill()
                session.runner.wait()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line: what the background made, and what it cost the tests in waiting."""
    if _TALLY:
        ran, waited = sum(t[1] for t in _TALLY), sum(t[2] for t in _TALLY)
        longest = sorted(_TALLY, key=lambda t: -t[1])
        shown = ", ".join(f"{n} {r:.0f} s" for n, r, _ in longest[:4])
        terminalreporter.write_line(
            f"background: {len(_TALLY)} real-engine runs took {ran:.0f} s beside the other tests"
            f" ({shown}{', ...' if len(longest) > 4 else ''}); the tests waited {waited:.0f} s"
            " for them"
        )
