"""The vLLM and SGLang presets against each version's own shapes.

- vLLM's batch-queue loop (``EngineCore.step_with_batch_queue``): one ``vllm_one_step`` (and
  with ``vllm_dp`` one ``step_process`` range and marker) per batch with tokens, from its
  ``schedule()`` to its ``update_from_output``, overlapping where batches are in flight together.
  The engine here is a stand-in that follows vLLM 0.32's method line by line, minus the executor;
  the real one runs in tests/test_engine_vllm_batch_queue.py.
- Prefill/decode by vLLM 0.11's ``SchedulerOutput`` (no ``CachedRequestData.is_context_phase``):
  the dataclasses below are faithful copies of 0.11's fields (``vllm/v1/core/sched/output.py``,
  ``NewRequestData`` 27-37, ``CachedRequestData`` 92-103, ``SchedulerOutput`` 122-166) and of the
  worker's ``CachedRequestState.num_prompt_tokens`` (``gpu_input_batch.py``), since vLLM 0.11 is
  not installed here. vLLM 0.32's real classes are checked in the vllm engine venv.
- SGLang 0.5.23's ``ForwardMode`` (``sglang/srt/model_executor/forward_batch_info.py`` 198-299):
  a copy of its members, in its order, since SGLang is not installed here.
"""

from __future__ import annotations

import enum
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
from support.stand_ins import fake_module

import mstx_marks
from mstx_marks.base import phases
from mstx_marks.capture import presets
from mstx_marks.capture.presets import sglang as sglang_preset
from mstx_marks.capture.presets.sglang import forward_kind
from mstx_marks.capture.presets.vllm import batch_kind

# --- vLLM's batch-queue loop ------------------------------------------------------------------


@dataclass
class Out:
    """The parts of a SchedulerOutput the engine and the preset read."""

    label: str
    total_num_scheduled_tokens: int


@dataclass
class TokenOut:
    new_token_ids: list[int]


@dataclass
class CoreOutputs:
    outputs: list[TokenOut]


class SchedulerMethods:
    __slots__ = ()
    plan: list[tuple[str, int]]

    def has_requests(self) -> bool:
        return bool(self.plan)

    def schedule(self, throttle_prefills: bool = False) -> Out:
        return Out(*self.plan.pop(0))

    def update_from_output(self, scheduler_output: Out, model_output: Any) -> Any:
        mstx_marks.instant(f"processed {scheduler_output.label}")
        tokens = [0] * min(scheduler_output.total_num_scheduled_tokens, 1)
        return {0: CoreOutputs([TokenOut(tokens)])}


class Scheduler(SchedulerMethods):
    def __init__(self, plan: list[tuple[str, int]]) -> None:
        self.plan = list(plan)
        self.running: list[str] = []
        self.waiting: list[str] = []


class SlottedScheduler(SchedulerMethods):
    """A scheduler without an instance ``__dict__``: the preset cannot hook it."""

    __slots__ = ("plan",)

    def __init__(self, plan: list[tuple[str, int]]) -> None:
        self.plan = list(plan)


class EngineCore:
    """vLLM 0.32's ``step_with_batch_queue`` (vllm/v1/engine/core.py 698-810), executor left out:
    a batch "runs" from its dispatch until the call that pops it."""

    def __init__(self, plan: list[tuple[str, int]]) -> None:
        self.scheduler: SchedulerMethods = Scheduler(plan)
        self.batch_queue_size = 2
        self.batch_queue: deque[Out] = deque(maxlen=2)
        self.step_fn = self.step_with_batch_queue

    def step(self) -> tuple[dict[int, Any], bool]:  # the other loop: never called here
        raise AssertionError("EngineCore.step on the batch-queue path")

    def step_with_batch_queue(self) -> tuple[Optional[dict[int, Any]], bool]:
        batch_queue = self.batch_queue
        assert len(batch_queue) < self.batch_queue_size
        model_executed = False
        if self.scheduler.has_requests():
            scheduler_output = self.scheduler.schedule(False)
            mstx_marks.instant(f"dispatched {scheduler_output.label}")
            model_executed = scheduler_output.total_num_scheduled_tokens > 0
            batch_queue.appendleft(scheduler_output)
            if len(batch_queue) < self.batch_queue_size and (
                model_executed or self.scheduler.has_requests()
            ):
                return None, model_executed
        elif not batch_queue:
            return None, False
        scheduler_output = batch_queue.pop()
        outputs = self.scheduler.update_from_output(scheduler_output, None)
        return outputs, model_executed


#: a: 3 tokens; b: none (its request still in flight); c, d: in flight together; f: the last.
PLAN = [("a", 3), ("b", 0), ("c", 1), ("d", 1), ("e", 0), ("f", 1)]
WITH_TOKENS = ["a", "c", "d", "f"]


def _run(engine: EngineCore) -> None:
    for _ in range(10):
        engine.step_fn()
    assert not engine.batch_queue and not engine.scheduler.plan


def _instant(records: list[Any], text: str) -> Any:
    (found,) = [r for r in records if r.kind == "instant" and r.name == text]
    return found


def _inside(outer: Any, inner: Any) -> bool:
    return bool(outer.start_ns <= inner.start_ns and inner.end_ns <= outer.end_ns)


def test_one_range_per_batch_with_tokens_from_schedule_to_processed(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    fake_module(monkeypatch, "vllm.v1.engine.core", EngineCore=EngineCore)
    before = dict(vars(EngineCore))
    report = presets.apply("vllm")
    assert report.patched == (
        "vllm.v1.engine.core:EngineCore.step",
        "vllm.v1.engine.core:EngineCore.step_with_batch_queue",
    )
    engine = EngineCore(PLAN)
    _run(engine)
    assert "schedule" not in vars(engine.scheduler)  # the hook lasts one call only
    report.undo()
    assert dict(vars(EngineCore)) == before
    records = recorder.records()
    steps = sorted((r for r in records if r.kind == "range"), key=lambda r: r.start_ns)
    assert [(r.name, r.domain) for r in steps] == [("vllm_one_step", "vllm_one_step")] * 4
    for step, label in zip(steps, WITH_TOKENS):
        dispatched, processed = (
            _instant(records, f"{w} {label}") for w in ("dispatched", "processed")
        )
        assert step.start_ns <= dispatched.start_ns and processed.start_ns <= step.end_ns
    c, d = steps[1], steps[2]
    assert d.start_ns < c.end_ns  # two batches in flight: their ranges overlap


def test_dp_ranges_and_markers_per_batch_wrap_the_step_ranges(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    fake_module(monkeypatch, "vllm.v1.engine.core", EngineCore=EngineCore)
    with presets.apply("vllm"), presets.apply("vllm_dp"):
        _run(EngineCore(PLAN))
    records = recorder.records()
    ranges = sorted((r for r in records if r.kind == "range"), key=lambda r: r.start_ns)
    dp = [r for r in ranges if r.domain == "step_process"]
    one = [r for r in ranges if r.domain == "vllm_one_step"]
    assert len(dp) == len(one) == 4
    markers = [r for r in records if r.kind == "instant" and r.domain == "step_process"]
    assert len(markers) == 4
    for outer, inner, marker in zip(dp, one, sorted(markers, key=lambda m: m.start_ns)):
        assert _inside(outer, inner)
        assert inner.end_ns <= marker.start_ns <= outer.end_ns
        assert '"out_tokens":1' in marker.name


def test_sampling_counts_batches_with_tokens_only(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    fake_module(monkeypatch, "vllm.v1.engine.core", EngineCore=EngineCore)
    with presets.apply("vllm", sample=mstx_marks.window(1, 3)):
        _run(EngineCore(PLAN))
    records = recorder.records()
    steps = sorted((r for r in records if r.kind == "range"), key=lambda r: r.start_ns)
    assert len(steps) == 2  # batches 1 and 2 of those with tokens: c and d
    for step, label in zip(steps, ["c", "d"]):
        assert step.start_ns <= _instant(records, f"processed {label}").start_ns <= step.end_ns


def test_a_scheduler_that_cannot_be_hooked_leaves_the_engine_running(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    fake_module(monkeypatch, "vllm.v1.engine.core", EngineCore=EngineCore)
    warned = pytest.warns(mstx_marks.MstxMarksWarning, match="no per-batch ranges")
    with warned, presets.apply("vllm"):
        engine = EngineCore(PLAN)  # step_fn is bound here, after the patch (as in vLLM)
        engine.scheduler = SlottedScheduler(PLAN)
        _run(engine)
    assert [r for r in recorder.records() if r.kind == "range"] == []


# --- vLLM 0.11's SchedulerOutput: prefill/decode without is_context_phase ------------------------


@dataclass
class NewRequestData011:
    req_id: str
    prompt_token_ids: list[int]
    mm_features: list[Any]
    sampling_params: Any
    pooling_params: Any
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    lora_request: Any
    prompt_embeds: Any = None


@dataclass
class CachedRequestData011:
    req_ids: list[str]
    resumed_from_preemption: list[bool]
    new_token_ids: list[list[int]]
    new_block_ids: list[Optional[tuple[list[int], ...]]]
    num_computed_tokens: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass
class SchedulerOutput011:
    scheduled_new_reqs: list[NewRequestData011]
    scheduled_cached_reqs: CachedRequestData011
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    scheduled_encoder_inputs: dict[str, list[int]] = field(default_factory=dict)
    num_common_prefix_blocks: list[int] = field(default_factory=list)
    finished_req_ids: set[str] = field(default_factory=set)
    free_encoder_mm_hashes: list[str] = field(default_factory=list)
    structured_output_request_ids: dict[str, int] = field(default_factory=dict)
    grammar_bitmask: Any = None
    kv_connector_metadata: Any = None


@dataclass
class CachedRequestState011:
    """The worker's request state; vLLM sets ``num_prompt_tokens`` in ``__post_init__``."""

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.prompt_token_ids)


def _out_011(new: dict[str, int], cached: dict[str, tuple[int, int]]) -> SchedulerOutput011:
    """``new``: req_id -> prompt length (all scheduled); ``cached``: req_id -> (computed before
    this step, tokens scheduled now)."""
    news = [NewRequestData011(r, [1] * n, [], None, None, ([0],), 0, None) for r, n in new.items()]
    ids = list(cached)
    cached_data = CachedRequestData011(
        ids, [False] * len(ids), [], [None] * len(ids), [cached[r][0] for r in ids]
    )
    tokens = {**new, **{r: n for r, (_, n) in cached.items()}}
    return SchedulerOutput011(news, cached_data, tokens, sum(tokens.values()))


#: The worker's ``model_runner.requests``: prompts of 8 tokens.
REQUESTS = {r: CachedRequestState011(r, [1] * 8, []) for r in ("a", "b", "c")}


@pytest.mark.parametrize(
    ("output", "kind"),
    [
        (_out_011({"a": 8}, {}), "prefill_batch"),
        (_out_011({}, {"a": (8, 1), "b": (9, 1)}), "decode_batch"),  # 0.11 said mixed_batch
        (_out_011({}, {"a": (4, 4)}), "prefill_batch"),  # a chunked prefill's second chunk
        (_out_011({"c": 8}, {"a": (8, 1)}), "mixed_batch"),
        (_out_011({}, {"a": (4, 4), "b": (10, 1)}), "mixed_batch"),
        (_out_011({}, {}), None),
    ],
)
def test_vllm_011_prefill_and_decode_from_computed_tokens(
    output: SchedulerOutput011, kind: str | None
) -> None:
    assert not hasattr(output.scheduled_cached_reqs, "is_context_phase")
    assert batch_kind(output, REQUESTS) == kind


def test_vllm_011_without_the_workers_requests_is_unknown() -> None:
    output = _out_011({}, {"a": (8, 1)})
    assert batch_kind(output) == "mixed_batch"
    assert batch_kind(output, {}) == "mixed_batch"  # a request the worker does not hold


def test_the_worker_patch_reads_its_runners_requests(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    class Runner:
        requests = REQUESTS

    class Worker:  # vllm/v1/worker/gpu_worker.py: execute_model(scheduler_output)
        model_runner = Runner()

        def execute_model(self, scheduler_output: Any) -> None:
            return None

    fake_module(monkeypatch, "vllm.v1.worker.gpu_worker", Worker=Worker)
    with presets.apply("vllm"):
        Worker().execute_model(_out_011({"c": 8}, {}))
        Worker().execute_model(_out_011({}, {"a": (8, 1), "c": (9, 1)}))
    # Each range keeps its own step's batch (the rollout's long tail reads them).
    assert [(r.name, r.domain, r.args) for r in recorder.records()] == [
        ("prefill_batch", "vllm", {"reqs": 1, "tokens": 8}),
        ("decode_batch", "vllm", {"reqs": 2, "tokens": 2}),
    ]


@dataclass
class CachedRequestData033:
    """vLLM 0.12+ (0.33: output.py 150-191): output counts, and ``is_context_phase``."""

    req_ids: list[str]
    resumed_req_ids: set[str]
    new_token_ids: list[list[int]]
    all_token_ids: dict[str, list[int]]
    new_block_ids: list[Optional[tuple[list[int], ...]]]
    num_computed_tokens: list[int]
    num_output_tokens: list[int]

    def is_context_phase(self, req_id: str) -> bool:
        num_output_tokens = dict(zip(self.req_ids, self.num_output_tokens)).get(req_id)
        return num_output_tokens is not None and num_output_tokens == 0


def test_vllm_033_uses_is_context_phase() -> None:
    cached = CachedRequestData033(["a", "b"], set(), [], {}, [None, None], [4, 9], [0, 1])
    out = SchedulerOutput011([], cached, {"a": 4}, 4)  # type: ignore[arg-type]
    assert batch_kind(out) == "prefill_batch"  # a's next prefill chunk: no output yet
    out.num_scheduled_tokens = {"b": 1}
    assert batch_kind(out) == "decode_batch"
    out.num_scheduled_tokens = {"a": 4, "b": 1}
    assert batch_kind(out) == "mixed_batch"


REAL_032 = r"""
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from mstx_marks.capture.presets.vllm import batch_kind

def out(new, cached, outputs, tokens):
    news = [NewRequestData(r, [1] * 8, [], None, None, ([0],), 0, None) for r in new]
    c = CachedRequestData.make_empty()
    c.req_ids, c.num_computed_tokens, c.num_output_tokens = cached, [8] * len(cached), outputs
    s = SchedulerOutput.make_empty()
    s.scheduled_new_reqs, s.scheduled_cached_reqs = news, c
    s.num_scheduled_tokens, s.total_num_scheduled_tokens = tokens, sum(tokens.values())
    return s

print(batch_kind(out(["a"], [], [], {"a": 8})))
print(batch_kind(out([], ["a", "b"], [1, 3], {"a": 1, "b": 1})))
print(batch_kind(out(["c"], ["a"], [1], {"a": 1, "c": 8})))
print(batch_kind(out([], ["a"], [0], {"a": 4})))
print(batch_kind(SchedulerOutput.make_empty()))
"""


def test_vllm_032s_real_scheduler_output() -> None:
    from support.engine_run import clean_env, venv_python

    python = venv_python("vllm")
    shown = subprocess.run(
        [str(python), "-c", REAL_032], env=clean_env(), capture_output=True, text=True,
        timeout=300, check=True, cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    assert shown.stdout.split() == [
        "prefill_batch", "decode_batch", "mixed_batch", "prefill_batch", "None"
    ]  # fmt: skip


# --- SGLang 0.5.23's ForwardMode ----------------------------------------------------------------


class ForwardMode(enum.IntEnum):
    """SGLang 0.5.23's members, in its order (no DRAFT_EXTEND v1, no DUMMY_FIRST there)."""

    EXTEND = enum.auto()
    DECODE = enum.auto()
    MIXED = enum.auto()
    IDLE = enum.auto()
    TARGET_VERIFY = enum.auto()
    DRAFT_EXTEND_V2 = enum.auto()
    PREBUILT = enum.auto()
    SPLIT_PREFILL = enum.auto()
    DLLM_EXTEND = enum.auto()


SGLANG_0_5_23 = {
    ForwardMode.EXTEND: "prefill_batch",
    ForwardMode.SPLIT_PREFILL: "prefill_batch",
    ForwardMode.DECODE: "decode_batch",
    ForwardMode.MIXED: "mixed_batch",
    ForwardMode.TARGET_VERIFY: "verify_batch",
    ForwardMode.DRAFT_EXTEND_V2: "draft_extend_batch",
    ForwardMode.IDLE: None,
    ForwardMode.PREBUILT: None,
    ForwardMode.DLLM_EXTEND: "mixed_batch",
}


@dataclass
class ForwardBatch:
    forward_mode: Any


def test_every_sglang_0_5_23_mode_is_mapped() -> None:
    assert set(SGLANG_0_5_23) == set(ForwardMode)
    for mode, kind in SGLANG_0_5_23.items():
        assert forward_kind(ForwardBatch(mode)) == kind, mode


def test_older_sglang_modes() -> None:
    Old = enum.IntEnum(
        "ForwardMode", "EXTEND DECODE MIXED IDLE TARGET_VERIFY DRAFT_EXTEND DUMMY_FIRST"
    )
    assert forward_kind(ForwardBatch(Old.DRAFT_EXTEND)) == "draft_extend_batch"
    assert forward_kind(ForwardBatch(Old.DUMMY_FIRST)) is None
    assert forward_kind(ForwardBatch(object())) == "mixed_batch"  # no name, no predicates


def test_sglang_runner_forward_ranges(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    class ModelRunner:  # sglang/srt/model_executor/model_runner.py
        def forward(self, forward_batch: ForwardBatch, skip_attn_backend_init: bool = False) -> Any:
            return forward_batch.forward_mode

    fake_module(monkeypatch, "sglang.srt.model_executor.model_runner", ModelRunner=ModelRunner)
    modes = list(ForwardMode)
    with presets.apply("sglang"):
        assert [ModelRunner().forward(ForwardBatch(m)) for m in modes] == modes
    expected = [(SGLANG_0_5_23[m], "sglang") for m in modes if SGLANG_0_5_23[m] is not None]
    assert [(r.name, r.domain) for r in recorder.records()] == expected


# --- the registry: the new phases, and no preset claim that nothing makes -----------------------


def test_new_phases_are_registered_as_preset_ranges() -> None:
    for name in ("verify_batch", "draft_extend_batch"):
        phase = phases.lookup(name)
        assert phase.emitted == "preset" and "SGLang" in phase.framework
    assert "SGLang" in phases.MIXED_BATCH.framework
    assert "step_with_batch_queue" in phases.VLLM_ONE_STEP.framework


def test_every_vllm_and_sglang_preset_phase_has_an_emitter() -> None:
    emitted = {t.phase for t in presets.TARGETS}
    emitted |= {"prefill_batch", "decode_batch", "mixed_batch"} | set(sglang_preset.KINDS)
    for phase in phases.all_phases():
        if phase.emitted == "preset" and any(
            word in phase.framework for word in ("vLLM", "SGLang")
        ):
            assert phase.name in emitted, phase
    for name in ("vllm_generate_sequences", "sglang_forward"):
        assert phases.lookup(name).emitted != "preset"
        assert name not in emitted


def test_each_threads_model_steps_keep_their_own_batch(
    monkeypatch: pytest.MonkeyPatch, recorder: mstx_marks.Recorder
) -> None:
    """Two workers in one process (threads), stepping at once: every range keeps the batch of the
    call that made it, never the other thread's."""
    import threading

    class Runner:
        requests = REQUESTS

    class Worker:
        model_runner = Runner()

        def execute_model(self, scheduler_output: Any) -> None:
            time.sleep(0)  # let the other thread in between the start and the end

    fake_module(monkeypatch, "vllm.v1.worker.gpu_worker", Worker=Worker)
    reqs = {"a": 1, "b": 2}
    seen: dict[int, int] = {}

    def steps(n: int) -> None:
        seen[threading.get_native_id()] = n
        cached = {r: (8, 1) for r in list(reqs)[:n]}
        for _ in range(200):
            Worker().execute_model(_out_011({}, cached))

    with presets.apply("vllm"):
        threads = [threading.Thread(target=steps, args=(n,)) for n in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    records = recorder.records()
    assert len(records) == 400
    assert all(r.args == {"reqs": seen[r.thread], "tokens": seen[r.thread]} for r in records)
