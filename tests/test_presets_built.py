"""The class a framework builds for its hot path is the one marked, on every platform.

Stand-ins here copy the shapes the presets touch: vLLM's ``WorkerWrapperBase.init_worker``
(``vllm/v1/worker/worker_base.py`` 0.32: ``self.worker = worker_class(**kwargs)`` with the class
named by ``parallel_config.worker_cls``), vllm-ascend's ``NPUWorker(WorkerBase)`` (0.23.0.post1
``vllm_ascend/worker/worker.py``: a sibling of vLLM's ``Worker``, overriding ``execute_model``
and ``sample_tokens``), SGLang's ``ModelRunner``. The real vllm-ascend classes, imported over
the matching vLLM with torch_npu stubbed, are in ``tests/test_vllm_ascend.py``.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from support.stand_ins import fake_module

import mstx_marks
from mstx_marks.base.records import InstantRecord, RangeRecord
from mstx_marks.capture import presets
from mstx_marks.launch.activate import parse_instrument


class _NewReq:
    def __init__(self, req_id: str) -> None:
        self.req_id = req_id


class _Cached:
    def __init__(self, context: set[str]) -> None:
        self.context = context

    def is_context_phase(self, req_id: str) -> bool:
        return req_id in self.context


class SchedulerOutput:
    """vLLM 0.23's ``SchedulerOutput`` fields that the batch kind reads."""

    def __init__(self, new: list[str], cached: dict[str, bool]) -> None:
        self.scheduled_new_reqs = [_NewReq(r) for r in new]
        self.scheduled_cached_reqs = _Cached({r for r, ctx in cached.items() if ctx})
        self.num_scheduled_tokens = {r: 1 for r in [*new, *cached]}
        self.total_num_scheduled_tokens = len(self.num_scheduled_tokens)


class WorkerBase:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class Worker(WorkerBase):  # vLLM's GPU worker: what the preset's first rows name
    __module__ = "vllm.v1.worker.gpu_worker"  # where the real class lives: what messages name

    def execute_model(self, scheduler_output: Any) -> str:
        return "gpu"

    def sample_tokens(self, grammar_output: Any) -> str:
        return "gpu sampled"


class NPUWorker(WorkerBase):  # vllm-ascend: derives from WorkerBase, not from Worker
    __module__ = "vllm_ascend.worker.worker"  # where the real class lives: what messages name

    def execute_model(self, scheduler_output: Any) -> str:
        return "npu"

    def sample_tokens(self, grammar_output: Any) -> str:
        return "npu sampled"


class OtherPlatformWorker(WorkerBase):  # a platform no preset knows
    __module__ = "other_platform.worker"  # where the real class lives: what messages name

    def execute_model(self, scheduler_output: Any) -> str:
        return "other"


class WorkerWrapperBase:
    worker_cls = ""

    def init_worker(self, all_kwargs: list[dict[str, Any]]) -> None:
        module, _, name = self.worker_cls.rpartition(".")
        worker_class = getattr(importlib.import_module(module), name)
        self.worker = worker_class(**all_kwargs[0])


@pytest.fixture
def vllm_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vLLM's worker modules and vllm-ascend's worker module as stand-ins (the module names the
    presets wait for), imported only when the test builds its worker."""
    fake_module(monkeypatch, "vllm.v1.worker.worker_base", WorkerBase=WorkerBase,
                WorkerWrapperBase=WorkerWrapperBase)  # fmt: skip
    fake_module(monkeypatch, "vllm.v1.worker.gpu_worker", Worker=Worker)
    fake_module(monkeypatch, "vllm_ascend.worker.worker", NPUWorker=NPUWorker)
    fake_module(monkeypatch, "other_platform.worker", OtherPlatformWorker=OtherPlatformWorker)
    armed = dict(presets._armed)
    presets._armed.clear()  # armed by an earlier test: this one arms what it needs itself
    saved = {c: dict(vars(c)) for c in (Worker, NPUWorker, OtherPlatformWorker, WorkerWrapperBase)}
    before = {f: len(presets._handles[f]) for f in presets.FRAMEWORKS}
    watches = len(presets._watches)
    yield
    for f in presets.FRAMEWORKS:  # only what this test added: earlier tests undid their own
        for handle in presets._handles[f][before[f] :]:
            handle.undo()
        del presets._handles[f][before[f] :]
    for handle in presets._watches[watches:]:
        handle.undo()
    del presets._watches[watches:]
    presets._armed.clear()
    presets._armed.update(armed)
    from mstx_marks.base import import_hooks
    from mstx_marks.capture.presets import built

    import_hooks._pending.clear()
    built._seen.clear()
    for cls, before in saved.items():
        assert dict(vars(cls)) == before  # everything undone


def _build(worker_cls: str) -> Any:
    wrapper = WorkerWrapperBase()
    wrapper.worker_cls = worker_cls
    wrapper.init_worker([{"rank": 0}])
    return wrapper.worker


@pytest.mark.parametrize("setting", ["verl,vllm", "vllm", "vllm_ascend", "vllm,vllm_ascend"])
def test_every_documented_line_marks_the_npu_worker(
    setting: str, vllm_on: None, recorder: mstx_marks.Recorder
) -> None:
    for name in parse_instrument(setting):
        presets.arm(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        worker = _build("vllm_ascend.worker.worker.NPUWorker")
        outs = [
            worker.execute_model(SchedulerOutput(["a", "b"], {})),
            worker.execute_model(SchedulerOutput([], {"a": False, "b": False})),
            worker.execute_model(scheduler_output=SchedulerOutput(["c"], {"a": False})),
            worker.sample_tokens(None),
        ]
    assert outs == ["npu", "npu", "npu", "npu sampled"]
    assert [(r.name, r.domain) for r in recorder.records() if isinstance(r, RangeRecord)] == [
        ("prefill_batch", "vllm"),
        ("decode_batch", "vllm"),
        ("mixed_batch", "vllm"),  # passed by keyword: still read
        ("sampling", "vllm"),
    ]
    assert not [w for w in caught if "not marked" in str(w.message)]


def test_a_worker_class_no_preset_marks_says_so_once_when_built(
    vllm_on: None, recorder: mstx_marks.Recorder
) -> None:
    presets.arm("vllm")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _build("other_platform.worker.OtherPlatformWorker")
        _build("other_platform.worker.OtherPlatformWorker")  # the same class again: no repeat
        _build("vllm.v1.worker.gpu_worker.Worker")  # covered: nothing said
    said = [str(w.message) for w in caught if w.category is mstx_marks.MstxMarksWarning]
    assert len(said) == 1, said
    assert "other_platform.worker:OtherPlatformWorker.execute_model" in said[0]
    assert "not marked" in said[0]
    assert 'mstx_marks.instrument("other_platform.worker:OtherPlatformWorker"' in said[0]
    assert first.execute_model(None) == "other"  # the worker itself is untouched
    # The files say it too: an instant in our own domain, which `coverage` reads.
    instants = [r for r in recorder.records() if isinstance(r, InstantRecord)]
    assert [(i.name, i.domain) for i in instants] == [
        ("uncovered other_platform.worker:OtherPlatformWorker.execute_model", "mstx_marks")
    ]


def test_a_known_class_without_its_preset_names_the_setting(vllm_on: None) -> None:
    presets.arm("verl")  # vLLM runs here, but only verl's preset is armed...
    presets._watch_built("vllm")  # ...and the vLLM worker is watched (as `coverage` would ask)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _build("vllm_ascend.worker.worker.NPUWorker")
    said = [str(w.message) for w in caught if "not marked" in str(w.message)]
    assert len(said) == 1
    assert "vllm_ascend.worker.worker:NPUWorker.execute_model" in said[0]
    assert "MSTX_MARKS_INSTRUMENT=vllm covers it" in said[0]


def test_sglang_forward_by_keyword_is_labelled(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    class Mode:
        name = "DECODE"

    class Batch:
        forward_mode = Mode()

    class ModelRunner:  # sglang 0.5.23 model_executor/model_runner.py
        def forward(self, forward_batch: Batch, skip_attn_backend_init: bool = False) -> int:
            return 1

    fake_module(monkeypatch, "sglang.srt.model_executor.model_runner", ModelRunner=ModelRunner)
    with presets.apply("sglang"):
        # dynamic_chunk_sizer.py calls it by keyword
        assert ModelRunner().forward(forward_batch=Batch()) == 1
    assert [r.name for r in recorder.records()] == ["decode_batch"]


def test_an_unknown_preset_name_says_the_closest() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert parse_instrument("vlm,verl") == ("verl",)
    (said,) = [str(w.message) for w in caught]
    assert "'vlm'" in said and "did you mean 'vllm'?" in said


def test_doctor_says_which_installed_worker_a_setting_leaves_unmarked(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mstx_marks.cli.doctor import diagnose

    (tmp_path / "vllm_ascend").mkdir()
    (tmp_path / "vllm_ascend" / "__init__.py").write_text("")  # found, never imported
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MSTX_MARKS_INSTRUMENT", "verl")
    (said,) = [f for f in diagnose() if "vllm_ascend is installed" in f.text]
    assert said.level == "warn" and "does not arm 'vllm'" in said.text
    assert "NPUWorker" in said.text
    monkeypatch.setenv("MSTX_MARKS_INSTRUMENT", "verl,vllm")
    (said,) = [f for f in diagnose() if "vllm_ascend is installed" in f.text]
    assert said.level == "ok" and "NPUWorker marked by the 'vllm' preset" in said.text
