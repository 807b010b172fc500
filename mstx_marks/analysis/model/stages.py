"""What a range is to the summary: one of the user's stages, a step, or an annotation the
frameworks make by themselves; and a stage marked twice, counted once. And the instants that say
a hot-path class ran unmarked.

**Automatic annotations.** PyTorch marks some of its own work with ``record_function``, and
Kineto writes those as ``user_annotation`` events beside the user's: DDP's
``DistributedDataParallel.forward`` (and ``DataParallel.forward``), FSDP's
``FullyShardedDataParallel.*`` and ``FSDP::*``, the optimizers' ``Optimizer.step#SGD.step`` and
``Optimizer.zero_grad#SGD.zero_grad``, the DataLoader's ``enumerate(DataLoader)#...``, every
process-group collective (``nccl:all_reduce``, ``gloo:broadcast``, ``mpi:``, ``ucc:``,
``xccl:``, ``hccl:``; on background threads too) and torch.compile's (``Torch-Compiled Region:
0/0``, ``TorchDynamo Cache Lookup``, ``CompiledFunction``, ``## Call CompiledFxGraph ... ##``,
``... (dynamo_timed)``). On Ascend, torch_npu marks each HCCL collective as an MSTX range in
the ``communication`` domain, its message a JSON object naming the operator and its group,
count and stream (``{"opName": "HcclAllreduce", "groupName": ..., "count": ...}``: a different
message for almost every call); such a range is read as the phase ``hccl:<opName>``
(:func:`range_name`), an automatic one. :func:`is_automatic` tells them by name. The summary
shows them apart from the user's phases: they take no self time from them, and are not in the
breakdown. Names the user chose stay the user's, however they look (``## forward ##`` is a
user's ``record_function``; torch_npu's own ``dataloader`` and ``save_checkpoint`` ranges are
phases of the registry).

**A stage marked twice.** A range nested directly in a range of the same phase (after folding
through the registry) on the same thread is the same stage marked twice, as verl's
``DistProfiler.annotate`` range ``actor_compute_log_prob`` around our own ``compute_log_prob``:
it counts once, as the outermost range (:func:`nested_repeats`; :class:`NestFrontier` does the
same for a file read in one pass). Only a phase the registry knows is a stage
(:func:`is_stage`): the two markers of one stage are the frameworks' and ours, both named
through the registry, whereas any other name nested in itself is taken as the user wrote it
(a recursive ``record_function``, an operator string msprof's database names twice), every
range counted. Steps and automatic annotations are not stages.

**A class that ran unmarked.** When a process builds the object a framework runs its hot path
on (vLLM's worker, SGLang's model runner, verl's worker) and no preset wraps that object's
method, it records an instant ``uncovered <module>:<Class>.<method>`` in domain ``mstx_marks``
(:mod:`mstx_marks.capture.presets.built`). It is a finding, not a phase nor one of the user's
instants: :func:`unmarked_method` tells it; the summary lists it in a note, and ``mstx-marks
coverage`` fails on it (:mod:`mstx_marks.analysis.model.coverage`).

>>> is_automatic("nccl:all_reduce"), is_automatic("Optimizer.step#AdamW.step")
(True, True)
>>> is_automatic("## forward ##"), is_automatic("compute_log_prob")
(False, False)
>>> range_name('{"opName": "HcclAllreduce", "count": "8"}', "communication")
'hccl:HcclAllreduce'
>>> rows = [(1, 0, -40, "compute_log_prob"), (1, 1, -39, "compute_log_prob")]
>>> nested_repeats(rows)
[1]
>>> nested_repeats([(1, 0, -40, "INT64;INT64"), (1, 1, -39, "INT64;INT64")])  # not a stage
[]
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Sequence

from mstx_marks.base import phases

__all__ = [
    "COMMUNICATION_DOMAIN",
    "UNCOVERED_DOMAIN",
    "UNCOVERED_PREFIX",
    "NestFrontier",
    "is_automatic",
    "is_stage",
    "merged_note",
    "method_name",
    "nested_repeats",
    "range_name",
    "unmarked_method",
    "unmarked_note",
]

#: The MSTX domain torch_npu marks HCCL's collectives in (``DOMAIN_COMMUNICATION``).
COMMUNICATION_DOMAIN = "communication"

#: The domain and the name's start of the instant a process records for a hot-path method no
#: preset wraps (:mod:`mstx_marks.capture.presets.built` writes them).
UNCOVERED_DOMAIN = "mstx_marks"
UNCOVERED_PREFIX = "uncovered "

_AUTOMATIC = re.compile(
    r"(?:nccl|gloo|mpi|ucc|xccl|hccl|lccl|mccl|fake):\S"  # c10d's collectives
    r"|(?:Distributed)?DataParallel\.forward\Z"
    r"|FullyShardedDataParallel\.|FSDP::"
    r"|Optimizer\.(?:step|zero_grad)#"
    r"|enumerate\(DataLoader\)#"
    r"|Torch-Compiled Region|TorchDynamo Cache Lookup\Z|CompiledFunction(?:Backward)?\Z"
    r"|## Call CompiledFxGraph |.* \(dynamo_timed\)\Z"
)


def is_automatic(name: str) -> bool:
    """Whether a phase called ``name`` is an annotation PyTorch (or torch_npu's HCCL
    instrumentation) makes by itself, not one of the user's (see the module's docstring).

    >>> [is_automatic(n) for n in ("gloo:all_reduce", "DistributedDataParallel.forward", "fwd")]
    [True, True, False]
    """
    return _AUTOMATIC.match(name) is not None


def range_name(name: str, domain: str) -> str:
    """The name a range is summarised under: ``hccl:<opName>`` for torch_npu's HCCL ranges
    (domain ``communication``, message a JSON object with ``opName``), else ``name``.

    >>> range_name("my_sync", "communication"), range_name("gen", "default")
    ('my_sync', 'gen')
    """
    if domain != COMMUNICATION_DOMAIN or not name.startswith("{"):
        return name
    try:
        message = json.loads(name)
    except ValueError:
        return name
    op = message.get("opName") if isinstance(message, dict) else None
    return f"hccl:{op}" if isinstance(op, str) and op else name


def is_stage(phase: str) -> bool:
    """Whether ``phase`` (a folded name) is a stage, whose ranges nested directly in one another
    are one stage marked twice: whether the phase registry knows it (a phase, an alias or an
    indexed name of one; see the module's docstring).

    >>> is_stage("compute_log_prob"), is_stage("actor_compute_log_prob"), is_stage("INT64;INT64")
    (True, True, False)
    """
    try:
        phases.lookup(phase)
    except (KeyError, TypeError, ValueError):
        return False
    return True


class _Stages:
    """:func:`is_stage`, remembered for the names one reading meets (a few, or many distinct
    names of which few nest in themselves: it is asked only of those, and forgets past
    :data:`_REMEMBERED`)."""

    __slots__ = ("known",)

    def __init__(self) -> None:
        self.known: dict[str, bool] = {}

    def __call__(self, phase: str) -> bool:
        found = self.known.get(phase)
        if found is None:
            if len(self.known) >= _REMEMBERED:
                self.known.clear()
            found = self.known[phase] = is_stage(phase)
        return found


_REMEMBERED = 4096


def unmarked_method(name: str, domain: str) -> str | None:
    """``<module>:<Class>.<method>`` when an instant called ``name`` in ``domain`` says that
    method ran unmarked (see the module's docstring), else None.

    >>> unmarked_method("uncovered vllm_ascend.worker:NPUWorker.execute_model", "mstx_marks")
    'vllm_ascend.worker:NPUWorker.execute_model'
    >>> unmarked_method("uncovered x:A.f", "default"), unmarked_method("tick", "mstx_marks")
    (None, None)
    """
    if domain != UNCOVERED_DOMAIN or not name.startswith(UNCOVERED_PREFIX):
        return None
    return name[len(UNCOVERED_PREFIX) :].strip() or None


def method_name(label: str) -> str:
    """``<Class>.<method>`` of a ``<module>:<Class>.<method>`` label.

    >>> method_name("vllm_ascend.worker:NPUWorker.execute_model")
    'NPUWorker.execute_model'
    """
    return label.rpartition(":")[2]


def unmarked_note(unmarked: dict[str, list[str]]) -> str:
    """The summary's note on the hot-path methods that ran unmarked, per process (its label:
    the ``<module>:<Class>.<method>`` labels).

    >>> print(unmarked_note({"WorkerDict rank 0": ["vllm.w:Worker.execute_model"]}))
    ... # doctest: +ELLIPSIS
    1 hot-path method ran unmarked ...: Worker.execute_model ran unmarked in WorkerDict rank 0
    """
    said = [f"{method_name(m)} ran unmarked in {who}" for who, ms in unmarked.items() for m in ms]
    return (
        f"{len(said)} hot-path method{'s' if len(said) != 1 else ''} ran unmarked (the class a"
        " framework built for it is one no preset wraps: its time is in no phase; `mstx-marks"
        f" coverage` fails on it): {'; '.join(said)}"
    )


def nested_repeats(ranges: Sequence[tuple[Any, int, int, str]]) -> list[int]:
    """The indices of ``ranges`` (``(thread, start, -end, phase)``, as
    :func:`~mstx_marks.analysis.model.aggregate.breakdown` takes them; not reordered) nested
    directly
    in a range of the same phase on the same thread, a phase the registry knows
    (:func:`is_stage`): each repeats the stage its parent counts.

    A range's parent is the latest-starting range of its thread that contains it (the innermost,
    when ranges nest). Equal spans: the first given is the outer.

    >>> lp, upd = "compute_log_prob", "update_actor"
    >>> nested_repeats([(1, 0, -10, lp), (1, 2, -8, upd), (1, 3, -5, lp), (2, 3, -5, lp)])
    []
    >>> nested_repeats([(1, 0, -10, lp), (1, 0, -10, lp), (1, 3, -5, lp)])
    [1, 2]
    >>> nested_repeats([(1, 0, -10, "fib"), (1, 3, -5, "fib")])  # not a stage: both count
    []
    """
    stage = _Stages()
    order = sorted(range(len(ranges)), key=lambda i: (*ranges[i][:3], i))
    repeats: list[int] = []
    # (end, phase) of the ranges that may hold a later one, outer first, each inside the one
    # below it: one that ends before this one cannot hold it, nor a later range (this one holds
    # that, and starts later), so only the top is ever popped (as in breakdown)
    stack: list[tuple[int, str]] = []
    nothing = thread = object()
    for i in order:
        key, _, neg_end, phase = ranges[i]
        e = -neg_end
        if thread is nothing or key != thread:
            stack, thread = [], key
        while stack and stack[-1][0] < e:
            stack.pop()
        if stack and stack[-1][1] == phase and stage(phase):  # its innermost container's
            repeats.append(i)
        stack.append((e, phase))
    return sorted(repeats)


class _Node:
    """One stage range in a :class:`NestFrontier`; ``payload`` is what :meth:`settle` gets."""

    __slots__ = ("children", "end", "payload", "phase", "repeat", "start")

    def __init__(self, start: int, end: int, phase: str, payload: Any) -> None:
        self.start, self.end, self.phase, self.payload = start, end, phase, payload
        self.repeat = False
        self.children: list[_Node] = []

    def contains(self, other: _Node) -> bool:
        return self.start <= other.start and other.end <= self.end


class NestFrontier:
    """:func:`nested_repeats` for one thread's ranges read one at a time, in bounded memory:
    :meth:`add` each, then :meth:`close`; ``settle(payload, repeat)`` is called once for each
    range, as soon as whether it repeats its parent's stage is known for good.

    It holds the ranges a later one may still be put inside or around: the latest range of
    each level along the latest nesting, and the latest ``window`` ranges of each of those
    levels. Ranges read in start order (each after those that contain it) or in end order (each
    after those it contains, as a recorder writes ranges when they end) are placed exactly; a
    range with more than ``window`` ranges directly inside it, read after them, may miss the
    oldest of them.

    >>> got = []
    >>> f = NestFrontier(lambda payload, repeat: got.append((payload, repeat)))
    >>> lp = "compute_log_prob"
    >>> for s, e, phase in [(1, 39, lp), (0, 40, lp), (50, 60, "upd")]:  # in end order
    ...     f.add(s, e, phase, payload=(s, e))
    >>> f.close()
    >>> sorted(got)
    [((0, 40), False), ((1, 39), True), ((50, 60), False)]
    """

    def __init__(self, settle: Callable[[Any, bool], None], window: int = 512) -> None:
        self.settle = settle
        self.window = window
        self.tops: list[_Node] = []
        self.stage = _Stages()

    def add(self, start: int, end: int, phase: str, payload: Any) -> None:
        node = _Node(start, end, phase, payload)
        level, parent = self.tops, None
        while level and level[-1].contains(node):  # read after what contains it
            parent = level[-1]
            level = parent.children
        cut = len(level)
        while cut and node.contains(level[cut - 1]):  # read after what it contains
            cut -= 1
        node.children = level[cut:]
        del level[cut:]
        for child in node.children:
            child.repeat = child.phase == phase and self.stage(phase)
        node.repeat = parent is not None and parent.phase == phase and self.stage(phase)
        if level:  # the one before it is nested in no later range: its inner ranges are settled
            self._settle_inside(level[-1])
        level.append(node)
        if len(level) > 2 * self.window:
            for old in level[: self.window]:
                self._settle(old)
            del level[: self.window]

    def close(self) -> None:
        """Settle every range still held (the thread's last)."""
        for node in self.tops:
            self._settle(node)
        self.tops = []

    def _settle(self, node: _Node) -> None:
        self.settle(node.payload, node.repeat)
        self._settle_inside(node)

    def _settle_inside(self, node: _Node) -> None:
        for child in node.children:
            self._settle(child)
        node.children = []


def merged_note(merged: dict[str, int], merged_ns: dict[str, int]) -> str:
    """The summary's note on the ranges counted once with the range around them (per phase:
    how many, ``merged``, and their time, ``merged_ns``).

    >>> print(merged_note({"compute_log_prob": 1}, {"compute_log_prob": 38 * 10**6}))
    ... # doctest: +ELLIPSIS
    1 range nested directly in a range of the same phase ... compute_log_prob (1, 38.000 ms)
    """
    total = sum(merged.values())
    which = ", ".join(
        f"{name} ({n}, {merged_ns.get(name, 0) / 1e6:.3f} ms)" for name, n in sorted(merged.items())
    )
    return (
        f"{total} range{'s' if total != 1 else ''} nested directly in a range of the same phase"
        " on the same thread counted once with it, as one stage (two markers around one call,"
        " as verl's actor_compute_log_prob around compute_log_prob); not in the figures:"
        f" {which}"
    )
