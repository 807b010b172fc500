"""The documentation: the site builds strictly, its generated pages come from the code, README
stays a three-minute read whose two commands are CI's, and the packages carry what they claim."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from mstx_marks.base import env
from mstx_marks.capture.presets import TARGETS
from mstx_marks.cli.main import COMMANDS, markdown_reference

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
TEST_COMMAND = (
    'python3 -m pip install -q torch==2.13.0 -e ".[test]" && '
    "python3 -m pip install -q --no-deps verl==0.9.1 && python3 -m pytest -q"
)


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page(name: str) -> str:
    return _hooks().expand((DOCS / name).read_text(encoding="utf-8"))


# --- generated pages -----------------------------------------------------------------------


def test_the_environment_page_is_the_env_table() -> None:
    assert env.markdown_table() in _page("reference/environment.md")


def test_the_compatibility_page_has_every_presets_version_row() -> None:
    page = _page("reference/compatibility.md")
    for t in TARGETS:
        row = next(
            (line for line in page.splitlines() if line.startswith(f"| `{t.framework}` | ")),
            None,
        )
        assert row is not None, t.framework
        assert f"| `{t.framework}` | {t.versions.replace('|', chr(92) + '|')} |" in page, t
        assert f"`{t.path}`" in page and f"`{t.module}`" in page, t


def test_the_cli_page_is_the_parser() -> None:
    page = _page("reference/cli.md")
    assert markdown_reference() in page
    for name in COMMANDS:
        assert f"## `mstx-marks {name}`" in page
    assert "--expect SPEC" in page and "--config CONFIG" in page


def test_every_generated_block_is_known_and_up_to_date() -> None:
    """The generated blocks are kept in the pages, so GitHub's view of the markdown shows them
    too (a bare marker showed nothing there); a block the code has moved on from fails here."""
    hooks = _hooks()
    blocks = 0
    for page in DOCS.rglob("*.md"):
        text = page.read_text(encoding="utf-8")
        blocks += text.count("<!-- generated:")
        assert text.count("<!-- generated:") == text.count(hooks.END), page
    assert blocks == 6
    # In a fresh interpreter: this one's registry holds the phases other tests registered.
    check = subprocess.run(
        [sys.executable, str(DOCS / "hooks.py"), "--check"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr


def test_doctest_examples_become_fenced_code() -> None:
    spec = importlib.util.spec_from_file_location("griffe_doctest", DOCS / "griffe_doctest.py")
    if importlib.util.find_spec("griffe") is None:
        pytest.skip("griffe (the docs extra) is not installed")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = "See :func:`~mstx_marks.mark`.\n\n>>> 1 + 1\n2\n\nAfter."
    assert (
        module.to_markdown(text)
        == "See `mstx_marks.mark`.\n\n```pycon\n>>> 1 + 1\n2\n```\n\nAfter."
    )


def test_every_page_in_the_nav_exists() -> None:
    nav = re.findall(r":\s*([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert len(nav) >= 20
    for name in nav:
        assert (DOCS / name).is_file(), name


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip('mkdocs is not installed: python3 -m pip install -e ".[docs]"')
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    api = (tmp_path / "reference" / "api" / "ranges.html").read_text(encoding="utf-8")
    assert "mstx_marks.core.ranges" in api and "&gt;&gt;&gt;" in api
    envpage = (tmp_path / "reference" / "environment.html").read_text(encoding="utf-8")
    assert "<table>" in envpage and "MSTX_MARKS_RECORD_CAPACITY" in envpage
    assert (tmp_path / "changelog.html").read_text(encoding="utf-8").count("Unreleased")
    _opens_from_a_file(tmp_path)


def _opens_from_a_file(site: Path) -> None:
    """README says to open build/site/index.html from a file: every link between pages names an
    existing file (a folder opens as a listing there), and search needs no server (the offline
    plugin's index is a script the page loads, not a fetch)."""
    broken = []
    for page in site.rglob("*.html"):
        if page.name == "404.html":  # a server's page, with absolute links: never opened so
            continue
        for href in re.findall(r'href="([^"#?]+)', page.read_text(encoding="utf-8")):
            if "://" in href or href.startswith(("mailto:", "data:")):
                continue
            target = (page.parent / href).resolve()
            if not target.is_file():
                broken.append(f"{page.relative_to(site)} -> {href}")
    assert broken == [], broken[:10]
    assert (site / "search" / "search_index.js").is_file()


# --- README --------------------------------------------------------------------------------


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
    assert blocks[0][1].strip() == (
        "python3 -m pip install -e . torch==2.13.0 && python3 -m mstx_marks demo --out demo-out"
    )
    assert blocks[1][1].strip() == TEST_COMMAND
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").rstrip("\n").splitlines()
    assert ci[-1] == TEST_COMMAND
    assert any("mkdocs build --strict" in line for line in ci[:-1])


def test_readme_links_lead_somewhere() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links
    for link in links:
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link


def test_the_changelog_keeps_a_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "Keep a Changelog" in text and "## [Unreleased]" in text
    assert re.search(r"^## \[\d+\.\d+\.\d+\]", text, re.M)


# --- packaging -------------------------------------------------------------------------------


def _pyproject() -> dict:  # type: ignore[type-arg]
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_metadata_claims_only_what_is_true() -> None:
    project = _pyproject()["project"]
    assert "urls" not in project  # no repository exists to point at
    assert project["license"] == "BSD-3-Clause"  # PEP 639: an SPDX expression, not a table
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]
    # torch==2.13.0 (README's first command) has wheels for 3.10 and newer only.
    assert project["requires-python"] == ">=3.10"
    versions = [c.rsplit(":: ", 1)[1] for c in project["classifiers"] if re.search(r"3\.\d+$", c)]
    assert versions and min(versions, key=lambda v: int(v.split(".")[1])) == "3.10"
    extras = project["optional-dependencies"]
    assert {"test", "docs"} <= set(extras)
    assert any(d.startswith("mkdocs") for d in extras["docs"])


def _build(tmp_path: Path, *args: str) -> Path:
    spec = importlib.util.find_spec("build")
    if spec is None or spec.origin is None:  # (None: the site's build/ folder, a namespace)
        pytest.skip("the build package is not installed")
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", *args, "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def test_the_sdist_carries_what_its_tests_need(tmp_path: Path) -> None:
    (sdist,) = _build(tmp_path, "--sdist").glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in (
        "tests/conftest.py",
        "tests/support/torch_npu_double.py",
        "tests/engines/verl_grpo.py",
        "benchmarks/overhead.py",
        "mkdocs.yml",
        "docs/hooks.py",
        "CHANGELOG.md",
        "mstx_marks/py.typed",
    ):
        assert needed in names, needed
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_wheel_carries_the_types(tmp_path: Path) -> None:
    (wheel,) = _build(tmp_path, "--wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = next(zf.read(n) for n in names if n.endswith(".dist-info/METADATA"))
    assert "mstx_marks/py.typed" in names
    assert "mstx_marks/launch/_startup/sitecustomize.py" in names
    assert not [n for n in names if n.startswith(("tests/", "docs/", "benchmarks/"))]
    assert b"License-Expression: BSD-3-Clause" in metadata
    assert b"Requires-Python: >=3.10" in metadata


def test_a_users_mypy_sees_the_types_after_the_editable_install(tmp_path: Path) -> None:
    """README's install (`pip install -e .`) in a fresh venv: the user's mypy finds the package
    (setuptools' default editable hook is invisible to it; package-dir maps the root instead)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "-e", str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    user = tmp_path / "user.py"
    user.write_text("from mstx_marks import mark\n\nreveal_type(mark('x'))\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp_path / "c"),
         "--python-executable", str(python), str(user)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    assert 'Revealed type is "mstx_marks.core.ranges.Mark"' in proc.stdout
