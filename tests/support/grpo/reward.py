"""The GRPO job's function reward (``reward.custom_reward_function.path`` points here).

A random model never gets a gsm8k answer right, so an exact-match reward would be 0 for every
sample, every group-normalised advantage 0, and the actor update a no-op. This one gives partial
credit that differs between two samples of one prompt: the share of the answer's characters the
response contains, a bonus for the ``####`` marker, and a small penalty for length. It is
deterministic and cheap (no imports beyond the standard library).
"""

from __future__ import annotations

from typing import Any


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any
) -> float:
    truth = str(ground_truth).strip()
    text = solution_str or ""
    if truth and text.rsplit("####", 1)[-1].strip() == truth:
        return 1.0
    overlap = sum(1 for c in set(truth) if c in text) / max(len(set(truth)), 1)
    marker = 0.2 if "####" in text else 0.0
    length = min(len(text), 200) / 1000.0
    return round(0.5 * overlap + marker - length, 6)
