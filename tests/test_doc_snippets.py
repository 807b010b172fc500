"""Every Python and shell block of README.md and docs/ runs, as a reader would copy it, or says on
the page why it cannot (``# fragment: WHY``). The rules: tests/support/doc_snippets.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.doc_snippets import ROOT, blocks, run_page
from support.recorded import synthetic_rank
from sybil.example import SybilFailure

from mstx_marks.base import phases
from mstx_marks.export import export_rank
from mstx_marks.profiling import windows

DOCS = ROOT / "docs"
PAGES = [
    ROOT / "README.md",
    *sorted(DOCS.glob("*.md")),
    *sorted(DOCS.glob("guides/*.md")),
    *sorted(DOCS.glob("reference/*.md")),
]


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the demo's `--out demo-out` holds for `summary` to read (two ranks' Chrome traces
    and Ascend databases), without the demo's 10 s: the pages run after README's first command."""
    folder = tmp_path_factory.mktemp("demo") / "demo-out"
    for rank in (0, 1):
        export_rank(folder, synthetic_rank(rank, slow=100 * rank))
    return folder


@pytest.fixture
def page_folder(tmp_path: Path, demo_out: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh folder for a page to run in, holding demo-out/; the phases a page registers are
    forgotten after it (other tests, and the docstring examples, register their own)."""
    shutil.copytree(demo_out, tmp_path / "demo-out")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(phases, "_by_name", dict(phases._by_name))
    monkeypatch.setattr(phases, "_phases", list(phases._phases))
    return tmp_path


# A block may warn as it does on a CPU machine (backends.md's configure(backend="mstx")).
@pytest.mark.filterwarnings("ignore::mstx_marks.MstxMarksWarning")
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_of_the_page_runs_or_says_why_not(page: Path, page_folder: Path) -> None:
    outcome = run_page(page)
    assert sorted([*outcome.ran, *outcome.skipped]) == [b.line for b in blocks(page)]
    assert all(why.strip() for why in outcome.skipped.values()), outcome.skipped
    # A page that leaves a capture hooked in fails here, not in whichever test runs next
    # (verl-ascend's capture_steps example once left Decoder.step hooked for test_recipes).
    assert windows._sites == {}, f"{page.name} left these methods hooked: {list(windows._sites)}"


def test_the_pages_that_teach_code_run_it() -> None:
    """Every Python block runs (none is a fragment), most of the blocks of the pages that teach
    the API run, and only README's setup and test commands (CI runs them verbatim) are skipped
    by a directive, which the reader does not see."""
    found = {p.relative_to(ROOT).as_posix(): blocks(p) for p in PAGES}
    python = {b.kind for page in found.values() for b in page if b.language == "python"}
    assert python == {"runs", "file"}, python
    for page in ("README.md", "docs/guides/own-program.md"):
        ran = [b for b in found[page] if b.kind in ("runs", "file")]
        assert len(ran) > len(found[page]) / 2, found[page]
    skipped = {
        p: [i for i, b in enumerate(page) if b.kind.startswith("skipped")]
        for p, page in found.items()
    }
    assert {p: s for p, s in skipped.items() if s} == {"README.md": [0, 1]}
    assert all(b.kind != "skipped: " for b in found["README.md"][:2])  # each says why


# --- the runner fails on a block that fails ---------------------------------------------------

BROKEN = {
    "python": "```python\nfrom mstx_marks import mark\n\nwith mark(n):\n    pass\n```\n",
    "bash": "```bash\nmstx-marks summary no-such-folder\n```\n",
    "console": "```console\n$ python -c 'print(1 + 1)'\n3\n```\n",
}


@pytest.mark.parametrize("language", sorted(BROKEN))
def test_a_block_that_fails_fails_the_page(
    language: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\nText.\n\n{BROKEN[language]}", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises((NameError, SybilFailure)) as failed:
        run_page(page)
    if language == "python":
        assert failed.type is NameError
        where = [(str(e.path), e.lineno + 1) for e in failed.traceback]  # pytest's lineno: from 0
        assert (str(page), 8) in where, where
    else:
        assert failed.type is SybilFailure and "line 5" in str(failed.value), failed.value


def test_files_transcripts_fragments_and_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        '```python title="job.py"\nprint("hello from job.py")\n```\n\n'
        "```console\n$ python job.py \\\n    && echo done\nhello from job.py\n...\n"
        "$ echo a b\na ...\n```\n\n"
        "```bash\n# fragment: needs an NPU\nexit 3\n```\n\n"
        '<!-- skip: next "CI runs it" -->\n\n```bash\nexit 4\n```\n\n'
        "```text\nnot run\n```\n\n"
        "```python\nx = 1 + 1\n```\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    outcome = run_page(page)
    assert (tmp_path / "job.py").read_text() == 'print("hello from job.py")\n'
    assert outcome.ran == [1, 5, 29]
    assert outcome.skipped == {14: "needs an NPU", 21: "CI runs it"}
