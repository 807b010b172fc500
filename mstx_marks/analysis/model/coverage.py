"""Phase coverage: which expected phases a profiled run never emitted, and which hot-path
classes it ran unmarked (``mstx-marks coverage``).

The check a CI job runs after a short profiled run, so that a framework upgrade that drops or
renames a range is caught the day it lands rather than when someone needs the profile. Names
are folded through the registry, so ``actor_update`` (verl 0.9.1) satisfies ``update_actor``.

A process that builds the object a framework runs its hot path on, of a class no preset wraps
(vllm-ascend's ``NPUWorker`` with only the ``vllm`` preset of an older release, a platform
plugin's worker, a user's own), records an instant ``uncovered <module>:<Class>.<method>``
(:mod:`mstx_marks.analysis.model.stages`). Each is reported per process, ``<Class>.<method> ran
unmarked in <process>``, and fails the check as a missing phase does: the phases that class
runs are in no range, whatever else the run emitted.

>>> from mstx_marks.base.records import InstantRecord, RangeRecord, RankTrace
>>> t = RankTrace(0, [RangeRecord("actor_update", "default", 0, 5, 1, 1)], role="trainer")
>>> report = check_coverage([t], ["update_actor", "gen"])
>>> report.missing, report.by_process["trainer rank 0"], report.ok
(['generate_sequences'], ['update_actor'], False)
>>> said = InstantRecord("uncovered my.worker:MyWorker.execute_model", "mstx_marks", 3, 1, 1)
>>> report = check_coverage([RankTrace(0, [said], role="EngineCore")], [])
>>> report.unmarked_lines(), report.ok
(['MyWorker.execute_model ran unmarked in EngineCore rank 0 (my.worker)'], False)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mstx_marks.analysis.model.aggregate import ProcessPart
from mstx_marks.analysis.model.stages import method_name, unmarked_method
from mstx_marks.base.phases import canonical
from mstx_marks.base.records import InstantRecord, RankTrace

__all__ = ["EXPECTATIONS", "CoverageReport", "check_coverage", "check_parts", "expected_phases"]

#: Named expectations: what a healthy run of that kind emits (canonical names).
EXPECTATIONS: dict[str, tuple[str, ...]] = {
    # verl's GRPO (no critic, reference policy for the KL loss), with the verl preset armed.
    # The reward is `compute_score` (RewardLoopWorker, one range per trajectory): 0.7.1-0.9.1
    # score a function reward there, and the v1 trainer (0.9) times no `reward` then.
    "verl-grpo": (
        "step",
        "generate_sequences",
        "compute_score",
        "compute_log_prob",
        "compute_ref_log_prob",
        "adv",
        "update_actor",
    ),
    # verl's PPO: GRPO's, plus the critic.
    "verl-ppo": (
        "step",
        "generate_sequences",
        "compute_score",
        "compute_log_prob",
        "compute_ref_log_prob",
        "compute_values",
        "adv",
        "update_critic",
        "update_actor",
    ),
    # verl's one-step-off GRPO (separate trainer and rollout pools): the colocated job's phases,
    # the overlapped rollout's launch, and both sides of the weight sync with the pause around it.
    "verl-async": (
        "step",
        "generate_sequences",
        "generate_async",
        "compute_score",
        "compute_log_prob",
        "compute_ref_log_prob",
        "adv",
        "update_actor",
        "update_weights",
        "actor_send_weights",
        "rollout_receive_weights",
        "rollout_pause",
        "rollout_resume",
    ),
    # verl's fully async GRPO: the trainer waits for samples (its `gen`; verl times
    # wait_for_enough_samples only with dynamic resource scheduling); weights are pushed every
    # trigger_parameter_sync_step updates (param_sync).
    "verl-fully-async": (
        "step",
        "generate_sequences",
        "compute_score",
        "update_actor",
        "update_weights",
        "actor_send_weights",
        "rollout_receive_weights",
    ),
    # A vLLM rollout with the vllm (or vllm_ascend) preset armed.
    "vllm": ("vllm_one_step", "prefill_batch", "decode_batch"),
    # The demo (python -m mstx_marks demo).
    "demo": (
        "step",
        "generate_sequences",
        "vllm_one_step",
        "reward",
        "compute_ref_log_prob",
        "compute_log_prob",
        "adv",
        "update_actor",
    ),
}


def _fold(name: str) -> str:
    try:
        return canonical(name)
    except KeyError:
        return name


def expected_phases(spec: str) -> list[str]:
    """``spec`` is a name of :data:`EXPECTATIONS`, or comma-separated phase names (``+``-joined
    mixes allowed: ``verl-grpo+vllm``). Unknown expectation names are a ValueError."""
    out: list[str] = []
    for part in spec.split("+"):
        part = part.strip()
        if part in EXPECTATIONS:
            names: Iterable[str] = EXPECTATIONS[part]
        elif "," in part or part:
            names = [n.strip() for n in part.split(",") if n.strip()]
        else:
            raise ValueError(f"empty expectation in {spec!r}")
        for name in names:
            if _fold(name) not in out:
                out.append(_fold(name))
    if not out:
        raise ValueError(
            f"expectation {spec!r} names no phase; use one of {', '.join(EXPECTATIONS)} or a list"
        )
    return out


@dataclass
class CoverageReport:
    """The expected phases no process emitted, what each process did emit of them, and the
    hot-path methods each process ran unmarked (``<module>:<Class>.<method>``)."""

    expected: list[str]
    missing: list[str]
    by_process: dict[str, list[str]] = field(default_factory=dict)
    unmarked: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the run passes: every expected phase emitted, no hot-path method unmarked
        (the exit status is 0 when it does, else 1)."""
        return not self.missing and not any(self.unmarked.values())

    def unmarked_lines(self) -> list[str]:
        """``<Class>.<method> ran unmarked in <process> (<module>)``, one per method and
        process."""
        return [
            f"{method_name(m)} ran unmarked in {process} ({m.rpartition(':')[0]})"
            for process, methods in self.unmarked.items()
            for m in methods
        ]

    def lines(self) -> list[str]:
        out = []
        for process, seen in self.by_process.items():
            absent = [p for p in self.expected if p not in seen]
            out.append(
                f"{process}: {len(seen)}/{len(self.expected)} expected phases"
                + (f"; never emitted here: {', '.join(absent)}" if absent else "")
            )
        out += self.unmarked_lines()
        if self.missing:
            out.append(f"MISSING in every process: {', '.join(self.missing)}")
        elif not self.ok:
            n = sum(len(m) for m in self.unmarked.values())
            out.append(
                f"UNMARKED: every one of the {len(self.expected)} expected phases was emitted,"
                f" but {n} hot-path method{'s' if n != 1 else ''} ran unmarked (no preset wraps"
                " the class the framework built)"
            )
        else:
            out.append(f"ok: every one of the {len(self.expected)} expected phases was emitted")
        return out

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data: ``ok``, ``expected``, ``missing``, and per process the
        expected phases it emitted and the methods it ran unmarked.

        >>> CoverageReport(["step"], [], {"rank 0": ["step"]}).to_json()["processes"]
        {'rank 0': {'emitted': ['step'], 'unmarked': []}}
        """
        processes = {
            p: {"emitted": seen, "unmarked": self.unmarked.get(p, [])}
            for p, seen in self.by_process.items()
        }
        return {
            "ok": self.ok,
            "expected": self.expected,
            "missing": self.missing,
            "processes": processes,
            "unmarked": [
                {"process": p, "method": method_name(m), "module": m.rpartition(":")[0]}
                for p, methods in self.unmarked.items()
                for m in methods
            ],
        }


def check_coverage(traces: Sequence[RankTrace], expected: Iterable[str]) -> CoverageReport:
    """Which of ``expected`` (folded to canonical names) the ``traces`` emitted, and which
    hot-path methods they ran unmarked, per process: by role, then rank (``WorkerDict rank 0``;
    ``rank 0`` when the role is unknown)."""
    found: list[tuple[str, set[str], list[str]]] = []
    for t in sorted(traces, key=lambda t: t.member):
        names, said = set(), []
        for r in t.records:
            method = unmarked_method(r.name, r.domain) if isinstance(r, InstantRecord) else None
            if method is None:
                names.add(_fold(r.name))
            elif method not in said:
                said.append(method)
        found.append((t.member.label, names, said))
    return _report(found, expected)


def check_parts(parts: Iterable[ProcessPart], expected: Iterable[str]) -> CoverageReport:
    """:func:`check_coverage` of the summary's parts, one per member (what ``coverage --ray``
    reads: :mod:`mstx_marks.analysis.readers.cluster`): a part names its phases, so the ranges count
    (and ``X_start``/``X_stop`` pairs), not the instants."""
    found = [
        (p.member.label, {_fold(n) for n in p.phases}, list(p.unmarked))
        for p in sorted(parts, key=lambda p: p.member)
    ]
    return _report(found, expected)


def _report(
    found: Iterable[tuple[str, set[str], list[str]]], expected: Iterable[str]
) -> CoverageReport:
    """The report of each process's ``(label, names emitted, methods run unmarked)``."""
    wanted = [_fold(n) for n in expected]
    by_process: dict[str, list[str]] = {}
    unmarked: dict[str, list[str]] = {}
    emitted: set[str] = set()
    for label, names, said in found:
        emitted |= names
        seen = by_process.setdefault(label, [])
        seen += [p for p in wanted if p in names and p not in seen]
        unmarked.setdefault(label, []).extend(m for m in said if m not in unmarked[label])
    unmarked = {p: sorted(m) for p, m in unmarked.items() if m}
    return CoverageReport(wanted, [p for p in wanted if p not in emitted], by_process, unmarked)
