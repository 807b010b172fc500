"""Phase coverage: which expected phases a profiled run never emitted (``mstx-marks coverage``).

The check a CI job runs after a short profiled run, so that a framework upgrade that drops or
renames a range is caught the day it lands rather than when someone needs the profile. Names
are folded through the registry, so ``actor_update`` (verl 0.9.1) satisfies ``update_actor``.

>>> from mstx_marks.base.records import RangeRecord, RankTrace
>>> t = RankTrace(0, [RangeRecord("actor_update", "default", 0, 5, 1, 1)], role="trainer")
>>> report = check_coverage([t], ["update_actor", "gen"])
>>> report.missing, report.by_process["trainer rank 0"]
(['generate_sequences'], ['update_actor'])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mstx_marks.base.phases import canonical
from mstx_marks.base.records import RankTrace

__all__ = ["EXPECTATIONS", "CoverageReport", "check_coverage", "expected_phases"]

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
    """The expected phases no process emitted, and what each process did emit of them."""

    expected: list[str]
    missing: list[str]
    by_process: dict[str, list[str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = []
        for process, seen in self.by_process.items():
            absent = [p for p in self.expected if p not in seen]
            out.append(
                f"{process}: {len(seen)}/{len(self.expected)} expected phases"
                + (f"; never emitted here: {', '.join(absent)}" if absent else "")
            )
        if self.missing:
            out.append(f"MISSING in every process: {', '.join(self.missing)}")
        else:
            out.append(f"ok: every one of the {len(self.expected)} expected phases was emitted")
        return out


def check_coverage(traces: Sequence[RankTrace], expected: Iterable[str]) -> CoverageReport:
    """Which of ``expected`` (folded to canonical names) the ``traces`` emitted, per process:
    by role, then rank (``WorkerDict rank 0``; ``rank 0`` when the role is unknown)."""
    wanted = [_fold(n) for n in expected]
    by_process: dict[str, list[str]] = {}
    emitted: set[str] = set()
    for t in sorted(traces, key=lambda t: t.member):
        names = {_fold(r.name) for r in t.records}
        emitted |= names
        label = t.member.label
        seen = by_process.setdefault(label, [])
        seen += [p for p in wanted if p in names and p not in seen]
    return CoverageReport(wanted, [p for p in wanted if p not in emitted], by_process)
