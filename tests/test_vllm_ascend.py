"""vllm-ascend's real NPU worker, marked by the ``vllm`` preset, on a machine without an NPU.

On Ascend, vLLM's worker is vllm-ascend's ``NPUWorker`` (``vllm_ascend.worker.worker`` from 0.13,
``vllm_ascend.worker.worker_v1`` in 0.11), which derives from vLLM's ``WorkerBase``, a sibling
of ``vllm.v1.worker.gpu_worker.Worker``, and overrides ``execute_model`` (and ``sample_tokens``
from 0.13). ``tests/support/npu_worker_run.py`` drives it with the published packages, in the
``vllm-ascend-0.23`` (vLLM 0.23.0 CPU build, vllm-ascend 0.23.0.post1) and ``vllm-ascend-0.11``
(vLLM 0.11.0, vllm-ascend 0.11.0) engine venvs, one process per case, with
``MSTX_MARKS_INSTRUMENT`` set as a job sets it.

Real: vLLM's ``EngineArgs.create_engine_config`` with vllm-ascend's ``NPUPlatform`` as the
current platform (it picks the worker class: ``worker_cls="auto"``), ``WorkerWrapperBase.
init_worker`` (which loads the ``vllm.general_plugins``: vllm-ascend's own patches and
mstx_marks' activation) running ``NPUWorker.__init__`` and vLLM's ``WorkerBase.__init__``,
vLLM's process groups (one rank, gloo instead of HCCL), the ``SchedulerOutput`` /
``NewRequestData`` / ``CachedRequestData`` / ``GrammarOutput`` objects of each vLLM release, and
the worker's own ``execute_model`` and ``sample_tokens``.

STAND-INS: ``torch_npu`` and the other Ascend-only packages (``tests/support/npu_stubs.py``:
stub modules, a 910B1 SoC, one device), ``torchvision`` on 0.23 (PyPI has no CPU build; only
transformers' Qwen2-VL processors import it); the worker's ``model_runner`` (vllm-ascend builds
``NPUModelRunner`` in ``init_device``, on a device: the stand-in returns at once and keeps
``requests`` as the real one does); the model (a ``config.json`` only, no weights). Ranges are
read from the in-process recorder (``MSTX_MARKS_BACKEND=record``), not through torch_npu's MSTX.

The steps, in order: a prefill of two new requests, their decode, a mixed step (one decodes
while a third request's 20-token prompt starts, chunked), the second chunk of that prompt alone
(a chunked prefill), its decode, and an empty step (no range). ``pytest -s`` prints the matrix
(line x setting x phases seen) at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.engine_run import clean_env, scenario_env
from support.npu_venvs import ascend_python

RUNNER = Path(__file__).parent / "support" / "npu_worker_run.py"
RUN_TIMEOUT_S = 300
LINES = ("0.23", "0.11")
#: As the guides set it: a verl job's (docs/guides/verl-ascend.md) first, then vLLM's alone
#: (docs/guides/engines.md). ``vllm_ascend`` is another name of ``vllm``, resolved before
#: anything is armed (``parse_instrument``'s doctest): its spellings would repeat these runs.
SETTINGS = ("verl,vllm", "vllm")
WORKER = {
    "0.23": "vllm_ascend.worker.worker.NPUWorker",
    "0.11": "vllm_ascend.worker.worker_v1.NPUWorker",
}
#: Imported once more after each run, and reported: the modules the torch_npu stubs must carry.
IMPORTED = {
    line: (worker.rpartition(".")[0], "vllm_ascend.worker.model_runner_v1", "vllm_ascend.platform")
    for line, worker in WORKER.items()
}
VERSIONS = {"0.23": ("0.23.0", "0.23.0.post1"), "0.11": ("0.11.0", "0.11.0")}
#: The step kind each scenario step must be marked as (``npu_worker_run.scenario``).
KINDS = {
    "prefill": "prefill_batch",
    "decode": "decode_batch",
    "mixed": "mixed_batch",
    "chunked_prefill": "prefill_batch",
    "empty": None,
}
#: vLLM 0.12+ samples in a call of its own (``sample_tokens``), vLLM 0.11 inside execute_model.
SAMPLES = {"0.23": True, "0.11": False}


@dataclass
class Outcome:
    result: dict[str, Any]
    stdout: str
    stderr: str

    def phases(self) -> list[list[str]]:
        """The range names recorded in each step."""
        return [[name for name, _ in step["ranges"]] for step in self.result["steps"]]


#: Every run of this module, for the matrix printed at the end.
_seen: dict[tuple[str, str, str], Outcome] = {}


def _run(python: Path, line: str, setting: str, where: Path, *args: str) -> Outcome:
    key = (line, setting, " ".join(args) or "NPUWorker")
    if key in _seen:
        return _seen[key]
    out = where / "result.json"
    env = {**scenario_env(python), **clean_env(MSTX_MARKS_INSTRUMENT=setting)}
    proc = subprocess.Popen(
        [str(python), str(RUNNER), str(out), *args, "--imports", *IMPORTED[line]],
        env=env, cwd=where,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"npu_worker_run.py did not end in {RUN_TIMEOUT_S} s:\n{stderr[-4000:]}")
    if not out.is_file():
        pytest.fail(
            f"npu_worker_run.py wrote no result (exit {proc.returncode}):\n{stderr[-4000:]}"
        )
    result = json.loads(out.read_text())
    assert "error" not in result, result["error"]
    assert proc.returncode == 0, stderr[-4000:]
    _seen[key] = Outcome(result, stdout, stderr)
    return _seen[key]


@pytest.fixture(scope="module", params=LINES)
def line(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def python(line: str) -> Path:
    return ascend_python(line)


@pytest.fixture(scope="module", autouse=True)
def _matrix() -> Iterator[None]:
    yield
    if _seen:
        print(matrix_text())


def matrix_text() -> str:
    """The runs of this module as a Markdown table, ready for a note."""
    rows = [
        "| vllm-ascend (vLLM) | MSTX_MARKS_INSTRUMENT | worker | phases per step |"
        " EngineCore step / batch queue wrapped | warnings |",
        "|---|---|---|---|---|---|",
    ]
    for (line, setting, case), run in sorted(_seen.items()):
        vllm, ascend = VERSIONS[line]
        steps = "; ".join(
            f"{s['step']}: {'+'.join(n for n, _ in s['ranges']) or '-'}"
            for s in run.result["steps"]
        )
        core = run.result["engine_core"]
        said = [w for w in run.result["warnings"] if "mstx_marks" in w]
        rows.append(
            f"| {ascend} ({vllm}) | `{setting}` | {run.result['worker'].rpartition('.')[2]}"
            f"{'' if case == 'NPUWorker' else f' (`{case}`)'} | {steps} |"
            f" {core['step']} / {core['step_with_batch_queue']} | {len(said)} |"
        )
    return "\n".join(rows)


# --- the venvs ------------------------------------------------------------------------------


def test_worker_modules_import_with_torch_npu_stubbed(
    python: Path, line: str, tmp_path: Path
) -> None:
    result = _run(python, line, SETTINGS[0], tmp_path).result
    assert result["imports"] == dict.fromkeys(IMPORTED[line], "ok")
    # Only Ascend-only packages (and torchvision, which PyPI has no CPU build of) are stubbed.
    assert set(result["stubbed"]) <= {"torch_npu", "torchair", "npugraph_ex", "acl", "torchvision"}
    assert "torch_npu" in result["stubbed"]


# --- the NPU worker, per setting ----------------------------------------------------------


@pytest.mark.parametrize("setting", SETTINGS)
def test_npu_worker_steps_are_marked(python: Path, line: str, setting: str, tmp_path: Path) -> None:
    run = _run(python, line, setting, tmp_path)
    result = run.result
    vllm, ascend = VERSIONS[line]
    assert (result["vllm"], result["vllm_ascend"]) == (vllm, ascend)
    # vllm-ascend's platform chose its own worker, and vLLM built it.
    assert result["platform"] == "vllm_ascend.platform.NPUPlatform"
    assert result["worker_cls"] == result["worker"] == WORKER[line]
    assert "vllm.v1.worker.worker_base.WorkerBase" in result["mro"]
    assert not any("gpu_worker" in k for k in result["mro"]), result["mro"]

    sampling = ["sampling"] if SAMPLES[line] else []
    expected = [[] if KINDS[s["step"]] is None else [KINDS[s["step"]], *sampling]
                for s in result["steps"]]  # fmt: skip
    assert run.phases() == expected, matrix_text()
    assert {d for s in result["steps"] for _, d in s["ranges"]} == {"vllm"}
    if SAMPLES[line]:  # vLLM's own verdict on each step agrees
        assert [KINDS[s["step"]] or "empty" for s in result["steps"]] == [
            s["vllm_kind"] for s in result["steps"]
        ]
    assert result["covered"]["execute_model"] is True
    assert result["covered"]["sample_tokens"] is (True if SAMPLES[line] else None)
    assert not [w for w in result["warnings"] if "not marked" in w], result["warnings"]


@pytest.mark.parametrize("setting", SETTINGS)
def test_engine_core_loops_stay_wrapped_under_vllm_ascend_patches(
    python: Path, line: str, setting: str, tmp_path: Path
) -> None:
    result = _run(python, line, setting, tmp_path).result
    assert result["engine_core"] == {"step": True, "step_with_batch_queue": True}
    # vllm-ascend's patches leave vLLM's own loops in place (the wrappers wrap vLLM's code).
    assert result["engine_core_code"] == {
        "step": "vllm.v1.engine.core",
        "step_with_batch_queue": "vllm.v1.engine.core",
    }


def test_activation_by_vllms_own_plugin_loading(python: Path, line: str, tmp_path: Path) -> None:
    """No early ``activate()``: only vLLM's ``load_general_plugins`` (as in a real worker
    process) applies the documented setting, after vLLM's modules are loaded."""
    run = _run(python, line, "verl,vllm", tmp_path, "--activation", "plugin")
    sampling = ["sampling"] if SAMPLES[line] else []
    assert run.phases() == [
        [] if KINDS[s["step"]] is None else [KINDS[s["step"]], *sampling]
        for s in run.result["steps"]
    ]
    assert run.result["engine_core"] == {"step": True, "step_with_batch_queue": True}


# --- a worker no preset knows ----------------------------------------------------------------


def test_a_worker_deriving_workerbase_directly_is_said_once(
    python: Path, line: str, tmp_path: Path
) -> None:
    """A worker class deriving vLLM's real ``WorkerBase`` (neither ``Worker`` nor
    ``NPUWorker``), built twice by ``WorkerWrapperBase.init_worker``: the process says, once,
    that its class is not marked, naming it. vllm-ascend 0.13+ routes every Python warning into
    vLLM's logger (``platform.py``: ``logging.captureWarnings(True)``), which writes to stdout;
    on 0.11 it goes to stderr as usual."""
    run = _run(python, line, "vllm", tmp_path, "--worker", "base", "--builds", "2")
    assert run.result["worker"].endswith(".BaseDerivedWorker")
    said = [w for w in run.result["warnings"] if "not marked" in w]
    assert len(said) == 1, run.result["warnings"]
    assert "BaseDerivedWorker" in said[0] and "execute_model" in said[0]
    stream = run.stdout if SAMPLES[line] else run.stderr
    shown = [x for x in stream.splitlines() if "not marked" in x]
    assert len(shown) == 1 and "BaseDerivedWorker" in shown[0], (run.stdout, run.stderr)
    assert run.phases() == [[] for _ in run.result["steps"]]  # nothing marks it
