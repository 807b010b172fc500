"""A preset is one module: docs/guides/write-a-preset.md's own snippet, saved where the page says
(in a copy of the package, so the tree stays as it is), shows up in every list derived from the
preset modules, and its targets mark a toy framework's calls in a run read back with
``mstx-marks summary --json``. And pyproject.toml declares the entry points the presets do."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mstx_marks.capture import presets

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "guides" / "write-a-preset.md"
#: A fenced block of the page: its language, its title (a file to save) and its text.
FENCE = re.compile(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', re.M | re.S)


def _blocks() -> list[tuple[str, str, str]]:
    return [m.groups(default="") for m in FENCE.finditer(PAGE.read_text(encoding="utf-8"))]


def _the_preset() -> tuple[str, str]:
    """The page's preset module: where it says to save it, and its text."""
    (found,) = [(t, text) for _, t, text in _blocks() if t.startswith("mstx_marks/")]
    return found


def _python(code: str, cwd: Path, env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A copy of the package with the page's preset saved in it, the page's other files in a
    work folder, and the environment that imports the copy first."""
    base = tmp_path_factory.mktemp("write-a-preset")
    package = base / "checkout"
    shutil.copytree(ROOT / "mstx_marks", package / "mstx_marks",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    work = base / "work"
    work.mkdir()
    for _, title, text in _blocks():
        if title:
            path = (package if title.startswith("mstx_marks/") else work) / title
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSTX_MARKS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(package), str(work)])
    return work, env


def test_the_page_saves_its_module_among_the_presets() -> None:
    title, text = _the_preset()
    assert Path(title).parent == Path("mstx_marks/capture/presets")
    assert "PRESETS = (" in text and "TARGETS = (" in text
    assert not (ROOT / title).exists()  # a toy: never in the real package


PROBE = """
    import importlib.util, json, sys
    import mstx_marks
    from mstx_marks.base import env, phases
    from mstx_marks.capture import presets
    from mstx_marks.launch import plugins
    from mstx_marks.profiling import recipes

    spec = importlib.util.spec_from_file_location("hooks", sys.argv[1])
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)

    mstx_marks.configure(backend="record")
    handle = presets.apply("tinyrl")
    from tinyrl.trainer import Trainer
    Trainer().fit(2)
    names = [r.name for r in mstx_marks.default_recorder().records()]
    handle.undo()
    armed = recipes.capture("tinyrl_steps", active=1)
    armed.undo()
    print(json.dumps({
        "module": presets.MODULES[-1].__file__,
        "frameworks": presets.FRAMEWORKS,
        "env": [r for r in env.markdown_table().splitlines() if env.INSTRUMENT in r],
        "presets_table": hooks.presets(),
        "compatibility": hooks.compatibility(),
        "phases_table": hooks.phases(),
        "phase": phases.lookup("tinyrl_sync").framework,
        "recipes": [r.name for r in recipes.RECIPES],
        "recipes_table": recipes.recipes_table(),
        "entry_points": presets.entry_points(),
        "plugin": plugins.tinyrl is plugins.vllm,
        "patched": handle.patched,
        "recorded": names,
    }))
"""


def test_the_toy_preset_is_in_every_list_and_marks_the_toy(
    checkout: tuple[Path, dict[str, str]],
) -> None:
    work, env = checkout
    hooks = str(ROOT / "docs" / "hooks.py")
    got: dict[str, Any] = json.loads(_python(PROBE, work, env, hooks).splitlines()[-1])
    assert got["module"].endswith("mstx_marks/capture/presets/tinyrl.py")
    assert got["module"].startswith(env["PYTHONPATH"].split(os.pathsep)[0])
    # A framework's preset: after the built-in ones, before those named on their own.
    main = [p.name for p in presets.PRESETS if not p.on_its_own]
    assert got["frameworks"] == [*main, "tinyrl", *presets.FRAMEWORKS[len(main) :]]
    (row,) = got["env"]
    assert ", tinyrl, " in row
    (row,) = [r for r in got["presets_table"].splitlines() if r.startswith("| `tinyrl` |")]
    assert "| `Trainer.train_step`, `Trainer.sync_weights` in the trainer process |" in row
    compatibility = "| `tinyrl` | tinyrl 0.1 | `tinyrl.trainer`: `Trainer.train_step`, "
    assert compatibility in got["compatibility"]
    assert re.search(r"^tinyrl_sync +default +preset +TinyRL 0\.1", got["phases_table"], re.M)
    assert got["phase"] == "TinyRL 0.1 Trainer.sync_weights (preset)"
    # A recipe that runs in any process: after those, before verl's (counted in verl steps).
    anywhere = [r.name for r in presets.RECIPES if not r.stages]
    assert got["recipes"] == [*anywhere, "tinyrl_steps", *(r.name for r in presets.RECIPES
                                                           if r.stages)]  # fmt: skip
    assert "tinyrl.trainer:Trainer.fit (a new window each call)" in got["recipes_table"]
    assert got["entry_points"]["tinyrl.plugins"] == "mstx_marks.launch.plugins:tinyrl"
    assert got["plugin"] is True
    assert got["patched"] == [
        "tinyrl.trainer:Trainer.train_step", "tinyrl.trainer:Trainer.sync_weights"
    ]  # fmt: skip
    assert got["recorded"] == ["update_actor", "tinyrl_sync"] * 2


def test_the_pages_commands_mark_the_toy_in_the_files(
    checkout: tuple[Path, dict[str, str]],
) -> None:
    """The page's own lines, run as a reader would in a checkout holding the module: its run
    writes the files, and the summary read from them counts each phase of the toy."""
    work, env = checkout
    (commands,) = [text for lang, _, text in _blocks() if lang == "bash"]
    assert commands.startswith("# fragment: ")
    env = {**env, "PATH": os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]])}
    proc = subprocess.run(["bash", "-eu", "-o", "pipefail", "-c", commands], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tinyrl_sync" in proc.stdout
    summary = subprocess.run(
        [sys.executable, "-m", "mstx_marks", "summary", "tiny-out", "--json"],
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert summary.returncode == 0, summary.stderr
    counts = {p["name"]: p["all"]["count"] for p in json.loads(summary.stdout)["phases"]}
    assert counts["update_actor"] == counts["tinyrl_sync"] == 3, counts


def test_a_module_that_claims_another_presets_name_is_refused(
    checkout: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    _, env = checkout
    package = Path(env["PYTHONPATH"].split(os.pathsep)[0])
    bad = tmp_path / "checkout"
    shutil.copytree(package, bad)
    (bad / "mstx_marks/capture/presets/twin.py").write_text(
        "from mstx_marks.capture.presets.declare import Preset\n"
        'PRESETS = (Preset("vllm", ("vllm",)),)\nTARGETS = ()\n',
        encoding="utf-8",
    )
    proc = subprocess.run(
        [sys.executable, "-c", "import mstx_marks.capture.presets"],
        cwd=tmp_path, env={**env, "PYTHONPATH": str(bad)}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "mstx_marks.capture.presets.twin: preset name 'vllm' is" in proc.stderr


def test_pyproject_declares_the_presets_entry_points() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {group: {"mstx_marks": value} for group, value in presets.entry_points().items()}
    lines = "".join(
        f'\n[project.entry-points."{group}"]\nmstx_marks = "{value}"\n'
        for group, value in presets.entry_points().items()
    )
    assert project["entry-points"] == declared, f"pyproject.toml should hold:\n{lines}"
    from mstx_marks.launch import plugins

    for value in presets.entry_points().values():
        _, _, name = value.partition(":")
        assert not name or callable(getattr(plugins, name)), value
