"""Every environment variable mstx_marks reads, and the process's rank: one home for both.

Each variable is declared once in :data:`VARIABLES` with its meaning; the README's table is
:func:`markdown_table`'s output (a test keeps the two equal). Readers never raise: the
environment is read on the hot path (at the first range), so a bad value warns once, naming
the variable, the value and the rule, and the default is used.

>>> import os
>>> os.environ["MSTX_MARKS_DISABLE"] = "on"
>>> flag("MSTX_MARKS_DISABLE")
True
>>> del os.environ["MSTX_MARKS_DISABLE"]
>>> [v.name for v in VARIABLES][:2]
['MSTX_MARKS_BACKEND', 'MSTX_MARKS_DISABLE']
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

from mstx_marks.base.diagnostics import warn_once

__all__ = [
    "BACKEND",
    "CAPTURE",
    "DISABLE",
    "EXCLUDE",
    "INCLUDE",
    "INSTRUMENT",
    "OFF",
    "OUT",
    "RANKS",
    "RECORD_CAPACITY",
    "ROLE",
    "RUN",
    "SAMPLE",
    "VARIABLES",
    "Variable",
    "any_set",
    "flag",
    "markdown_table",
    "off",
    "positive_int",
    "rank",
    "run_id",
    "text",
]


class Variable(NamedTuple):
    """One environment variable: its name, the values it takes, and what it does."""

    name: str
    values: str
    meaning: str


BACKEND = "MSTX_MARKS_BACKEND"
DISABLE = "MSTX_MARKS_DISABLE"
OFF = "MSTX_MARKS_OFF"
INCLUDE = "MSTX_MARKS_INCLUDE"
EXCLUDE = "MSTX_MARKS_EXCLUDE"
RANKS = "MSTX_MARKS_RANKS"
RECORD_CAPACITY = "MSTX_MARKS_RECORD_CAPACITY"
OUT = "MSTX_MARKS_OUT"
INSTRUMENT = "MSTX_MARKS_INSTRUMENT"
SAMPLE = "MSTX_MARKS_SAMPLE"
CAPTURE = "MSTX_MARKS_CAPTURE"
ROLE = "MSTX_MARKS_ROLE"
RUN = "MSTX_MARKS_RUN"

VARIABLES: tuple[Variable, ...] = (
    Variable(BACKEND, "auto, mstx, nvtx, torch, record, noop", "where ranges go (default auto)"),
    Variable(
        DISABLE,
        "1/0, true/false, yes/no, on/off",
        "switch every range off (`configure(enabled=True)` switches them back on)",
    ),
    Variable(
        OFF,
        "1/0, true/false, yes/no, on/off; read once, at import",
        "the hard off switch: `mstx_range` returns the function itself and `mark` a shared "
        "no-op, nothing is patched, and nothing can switch ranges on later in that process",
    ),
    Variable(INCLUDE, "comma-separated domains", "only these domains emit"),
    Variable(EXCLUDE, "comma-separated domains", "every domain but these emits"),
    Variable(RANKS, "comma-separated ranks, e.g. `0,1`", "only these ranks emit"),
    Variable(
        RECORD_CAPACITY,
        "an int >= 1 (default 1000000)",
        "how many events the in-process recorder keeps; later ones are counted as dropped",
    ),
    Variable(
        OUT,
        "a folder",
        "every process records its ranges (beside the device backend) and writes them there",
    ),
    Variable(
        INSTRUMENT,
        "comma-separated: verl, vllm, vllm_ascend, sglang, mindspeed_rl, megatron, "
        "verl_modules, vllm_modules, vllm_dp",
        "apply these frameworks' presets in every process that imports them",
    ),
    Variable(
        SAMPLE,
        "`PHASE=POLICY;...`, e.g. `vllm_one_step=window(30,70)`",
        "sample the presets' ranges of that phase",
    ),
    Variable(
        CAPTURE,
        "`RECIPE:wait=..,warmup=..,active=..,repeat=..;...`",
        "start a scheduled profiler around a named loop (`mstx-marks recipes`)",
    ),
    Variable(ROLE, "a word, e.g. `rollout`", "the process's role in file names and reports"),
    Variable(
        RUN,
        "a word (set by the launcher or the job's first process)",
        "the run id every process of one run of the job shares; `summary` reads the newest run",
    ),
)


_off: list[bool] = []


def off() -> bool:
    """Whether ``MSTX_MARKS_OFF`` switched the library off; read at the first call (which
    importing :mod:`mstx_marks` makes) and never again, so it holds for the whole process."""
    if not _off:
        _off.append(flag(OFF))
    return _off[0]


def text(name: str) -> str | None:
    """The variable's value with surrounding blanks removed; None when unset or blank."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    return raw.strip()


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(name: str, default: bool = False) -> bool:
    """A yes/no variable: 1/0, true/false, yes/no, on/off (any case); anything else warns once."""
    raw = text(name)
    if raw is None:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    warn_once(
        (name, raw),
        f"ignoring {name}={raw!r}: expected one of {', '.join(_TRUE + _FALSE)}",
    )
    return default


def positive_int(name: str, default: int) -> int:
    """An int >= 1; anything else (``1e5``, ``-5``) warns once and gives ``default``."""
    raw = text(name)
    if raw is None:
        return default
    # str.isdigit() is True for '²', which int() refuses: ASCII digits only.
    if raw.isascii() and raw.isdigit() and int(raw) >= 1:
        return int(raw)
    warn_once((name, raw), f"ignoring {name}={raw!r}: expected an int >= 1; using {default}")
    return default


def run_id() -> str:
    """The id of this run of the job: ``MSTX_MARKS_RUN`` when set (the launcher, or the job's
    first process, sets it), else a new one (time first, so ids sort by start) put in the
    environment, so every process this one starts from now on shares it.

    >>> import os
    >>> os.environ["MSTX_MARKS_RUN"] = "20250101-000000-ab12"
    >>> run_id()
    '20250101-000000-ab12'
    >>> del os.environ["MSTX_MARKS_RUN"]
    """
    raw = text(RUN)
    if raw is not None:
        cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in raw)
        return cleaned[:64]
    import secrets
    import time

    new = _ray_run() or time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
    os.environ[RUN] = new
    return new


def _ray_run() -> str | None:
    """In a Ray job whose driver set no run id (Ray starts workers from its raylet, not from the
    driver's environment): one id for every process of that Ray session and job, from the
    session's start time and the job id, so that all its actors are one run.

    A hack: Ray has no public accessor for the session's name (``session_<date>_<time>_...``,
    https://docs.ray.io/en/latest/ray-core/configure.html#logging-and-debugging); read where
    Ray 2.x keeps it, and fall back to a new id when that fails.
    """
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        session = str(ray._private.worker._global_node.session_name)
        job = str(ray.get_runtime_context().get_job_id())
    except Exception:  # not connected, or another Ray: a new id
        return None
    parts = session.split("_")  # ['session', '2026-12-01', '23-25-59', '503406', '22631']
    if len(parts) < 4 or not job.isalnum():
        return None
    return f"{parts[1].replace('-', '')}-{parts[2].replace('-', '')}-ray{parts[3]}-{job}"


def any_set() -> bool:
    """Whether any ``MSTX_MARKS_*`` variable is set: with none, the library changes nothing."""
    # The run id alone (which a process sets for its children) asks for nothing.
    return any(k.startswith("MSTX_MARKS_") and k != RUN for k in os.environ)


def rank() -> int:
    """This process's rank: ``RANK`` (as torchrun sets it), else torch.distributed's rank when
    it is initialised, else 0. A ``RANK`` that is not an int >= 0 warns once and is skipped.

    >>> import os
    >>> os.environ["RANK"] = " 3"
    >>> rank()
    3
    >>> del os.environ["RANK"]
    """
    raw = os.environ.get("RANK")
    if raw is not None and raw.strip():
        value = raw.strip()
        # str.isdigit() is True for '²'; int() is the judge, ASCII digits only.
        if value.isascii() and value.isdigit():
            return int(value)
        warn_once(("RANK", raw), f"ignoring RANK={raw!r}: expected an int >= 0")
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return 0


def markdown_table() -> str:
    """The README's table of environment variables.

    >>> markdown_table().splitlines()[0]
    '| variable | values | what it does |'
    """
    rows = ["| variable | values | what it does |", "|---|---|---|"]
    rows += [f"| `{v.name}` | {v.values} | {v.meaning} |" for v in VARIABLES]
    return "\n".join(rows)
