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
from typing import Iterable, Mapping, NamedTuple

from mstx_marks.base.diagnostics import warn_once

__all__ = [
    "BACKEND",
    "CAPTURE",
    "DISABLE",
    "EXCLUDE",
    "EXIT_SECONDS",
    "INCLUDE",
    "INSTRUMENT",
    "LIVE",
    "MAX_DIGITS",
    "OFF",
    "OUT",
    "PREFIX",
    "QUOTE",
    "RANKS",
    "RAY_CLOCK",
    "RECORD_CAPACITY",
    "RECORD_NAMES",
    "ROLE",
    "RUN",
    "SAMPLE",
    "VARIABLES",
    "Variable",
    "any_set",
    "declare_presets",
    "flag",
    "markdown_table",
    "off",
    "positive_int",
    "quoted",
    "rank",
    "run_id",
    "run_id_given",
    "say_unknown_names",
    "shown",
    "text",
    "unknown_names",
]


class Variable(NamedTuple):
    """One environment variable: its name, the values it takes, and what it does."""

    name: str
    values: str
    meaning: str


#: What every variable's name starts with.
PREFIX = "MSTX_MARKS_"
BACKEND = "MSTX_MARKS_BACKEND"
DISABLE = "MSTX_MARKS_DISABLE"
OFF = "MSTX_MARKS_OFF"
INCLUDE = "MSTX_MARKS_INCLUDE"
EXCLUDE = "MSTX_MARKS_EXCLUDE"
RANKS = "MSTX_MARKS_RANKS"
RECORD_CAPACITY = "MSTX_MARKS_RECORD_CAPACITY"
RECORD_NAMES = "MSTX_MARKS_RECORD_NAMES"
OUT = "MSTX_MARKS_OUT"
EXIT_SECONDS = "MSTX_MARKS_EXIT_SECONDS"
INSTRUMENT = "MSTX_MARKS_INSTRUMENT"
SAMPLE = "MSTX_MARKS_SAMPLE"
CAPTURE = "MSTX_MARKS_CAPTURE"
ROLE = "MSTX_MARKS_ROLE"
RUN = "MSTX_MARKS_RUN"
LIVE = "MSTX_MARKS_LIVE"
RAY_CLOCK = "MSTX_MARKS_RAY_CLOCK"

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
        RECORD_NAMES,
        "an int >= 1 (default 65536)",
        "how many distinct (name, domain) pairs the recorder keeps per process; later new names "
        "are recorded as `(other names)` in their domain, said once",
    ),
    Variable(
        OUT,
        "a folder",
        "every process records its ranges (beside the device backend) and writes them there",
    ),
    Variable(
        EXIT_SECONDS,
        "an int >= 1 (default 5)",
        "how long a process's last write (at exit, or from SIGTERM on) may take; what does not fit "
        "is said, stays in the spill, and `mstx-marks export` writes it",
    ),
    Variable(
        INSTRUMENT,
        # The names: the presets declare them (declare_presets), and markdown_table lists them.
        "comma-separated preset names",
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
        LIVE,
        "1/0, true/false, yes/no, on/off (default on)",
        "with `MSTX_MARKS_OUT` and the verl preset: each step's figures (per role busy and idle,"
        " rollout long tail, critical path, weight sync) go to verl's own logger under `mstx/`;"
        " 0 turns that off",
    ),
    Variable(
        RAY_CLOCK,
        "1/0, true/false, yes/no, on/off (default on)",
        "with `MSTX_MARKS_OUT`, each Ray process measures its clock against one small actor"
        " (`mstx_marks_clock`, no CPU) from time to time, so that `summary` aligns machines'"
        " clocks; 0 turns that off",
    ),
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
        f"ignoring {name}={quoted(raw)}: expected one of {', '.join(_TRUE + _FALSE)}",
    )
    return default


#: The most digits a count may have: 18 fit an int64 (files and databases hold them so), and
#: int() of a 5,000-digit string raises (CPython's limit on int from str) where nothing may.
MAX_DIGITS = 18


def _count(raw: str) -> int | None:
    """``raw`` as an int >= 0: ASCII digits (``'²'`` is a digit to ``str.isdigit``, not to
    ``int``), at most :data:`MAX_DIGITS` of them after leading zeros; else None.

    >>> _count("0042"), _count("9" * 5000), _count("²")
    (42, None, None)
    """
    if not (raw.isascii() and raw.isdigit()):
        return None
    digits = raw.lstrip("0") or "0"
    return int(digits) if len(digits) <= MAX_DIGITS else None


def positive_int(name: str, default: int) -> int:
    """An int >= 1; anything else (``1e5``, ``-5``, 5,000 digits) warns once and gives
    ``default``."""
    raw = text(name)
    if raw is None:
        return default
    value = _count(raw)
    if value is not None and value >= 1:
        return value
    warn_once(
        (name, raw),
        f"ignoring {name}={quoted(raw)}: expected an int >= 1 of at most {MAX_DIGITS} digits;"
        f" using {default}",
    )
    return default


#: How many characters of a value a message quotes.
QUOTE = 120


def quoted(value: str, limit: int = QUOTE) -> str:
    """``repr(value)``, cut after ``limit`` characters and then saying how long it was: every
    message that echoes what a user gave (a variable's value, a folder, a command) quotes it
    through this, so a 90 KB value is never 90 KB of stderr per process.

    >>> quoted("prof")
    "'prof'"
    >>> quoted("ab" * 100, limit=4)
    "'abab'... (200 characters)"
    """
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def shown(value: object, limit: int = QUOTE) -> str:
    """``str(value)`` as it is when short (a folder in a message reads plainly), else
    :func:`quoted`.

    >>> shown("/tmp/prof"), shown("x" * 500)[-16:]
    ('/tmp/prof', '(500 characters)')
    """
    text = str(value)
    return text if len(text) <= limit else quoted(text, limit)


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
    _made_run[:] = [new]
    return new


#: The run id this process made and put in the environment (none when it was given one).
_made_run: list[str] = []


def run_id_given() -> bool:
    """Whether ``MSTX_MARKS_RUN`` holds a run id this process was given (by the launcher, the
    process that started it, the user), not the one :func:`run_id` made here.

    >>> import os
    >>> _ = os.environ.pop("MSTX_MARKS_RUN", None)
    >>> _ = run_id()
    >>> run_id_given()
    False
    >>> os.environ["MSTX_MARKS_RUN"] = "20250101-000000-ab12"
    >>> run_id_given()
    True
    >>> del os.environ["MSTX_MARKS_RUN"]
    """
    value = os.environ.get(RUN)
    return value is not None and value.strip() != "" and value not in _made_run


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


def unknown_names(names: Iterable[str] | None = None) -> list[str]:
    """One message for each name with our prefix (of ``names``, else of the environment) that
    is no variable of the library, a typo most likely, with the closest known name: such a
    variable is ignored, and without a word the user waits for files that never come.

    >>> said = unknown_names([OUT + "PUT", OUT, "PATH"])
    >>> len(said), said[0].endswith(f"did you mean {OUT}?")
    (1, True)
    """
    return [line for _, line in _unknown(names)]


def say_unknown_names(names: Iterable[str] | None = None) -> None:
    """Warn :func:`unknown_names`' messages, each name once per process: what ``import
    mstx_marks`` runs (one pass over the environment, no import unless a name is unknown), and
    activation again for a name set after the import.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     for _ in range(2):
    ...         say_unknown_names([PREFIX + "OUTT"])
    >>> len(w), str(w[0].message).endswith("did you mean MSTX_MARKS_OUT?")
    (1, True)
    """
    for name, line in _unknown(names):
        warn_once(("unknown variable", name), line)


def _unknown(names: Iterable[str] | None) -> list[tuple[str, str]]:
    ours = sorted(n for n in (os.environ if names is None else names) if n.startswith(PREFIX))
    known = {v.name for v in VARIABLES}
    unknown = [n for n in ours if n not in known]
    if not unknown:  # the usual case, and the import's: nothing more is done
        return []
    import difflib  # only when a name is unknown

    suffixes = [v.name[len(PREFIX) :] for v in VARIABLES]
    out = []
    for name in unknown:
        # Close to the part after the prefix: the shared prefix makes every name look alike.
        close = difflib.get_close_matches(name[len(PREFIX) :], suffixes, n=1, cutoff=0.6)
        if close:
            hint = f"did you mean {PREFIX}{close[0]}?"
        else:
            hint = f"known: {', '.join(v.name for v in VARIABLES)}"
        said = f"ignoring {shown(name)}: mstx_marks has no variable of that name; {hint}"
        out.append((name, said))
    return out


def any_set() -> bool:
    """Whether any ``MSTX_MARKS_*`` variable is set: with none, the library changes nothing."""
    # The run id alone (which a process sets for its children) asks for nothing.
    return any(k.startswith(PREFIX) and k != RUN for k in os.environ)


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
        value = _count(raw.strip())
        if value is not None:
            return value
        warn_once(
            ("RANK", raw),
            f"ignoring RANK={quoted(raw)}: expected an int >= 0 of at most {MAX_DIGITS} digits",
        )
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return 0


#: The preset names :data:`INSTRUMENT` takes, and their aliases (alias -> name). The presets sit
#: above this module, which cannot import them: :mod:`mstx_marks.capture.presets` declares them
#: here when it is imported (:func:`declare_presets`).
_preset_names: list[str] = []
_preset_aliases: dict[str, str] = {}


def declare_presets(names: Iterable[str], aliases: Mapping[str, str]) -> None:
    """Record the preset names (and aliases) that :data:`INSTRUMENT` takes, which
    :func:`markdown_table` lists: what :mod:`mstx_marks.capture.presets` derives from its
    preset modules, once, when it is imported.

    >>> import mstx_marks.capture.presets  # it declares its names
    >>> "| comma-separated: verl, vllm, " in markdown_table()
    True
    """
    _preset_names[:] = names
    _preset_aliases.clear()
    _preset_aliases.update(aliases)


def _as_shown(v: Variable) -> Variable:
    if v.name != INSTRUMENT or not _preset_names:
        return v
    others = "".join(f" (`{a}` is `{name}`'s other name)" for a, name in _preset_aliases.items())
    return v._replace(
        values=f"comma-separated: {', '.join(_preset_names)}", meaning=v.meaning + others
    )


def markdown_table() -> str:
    """The README's table of environment variables (with the preset names the presets declared,
    once :mod:`mstx_marks.capture.presets` is imported).

    >>> markdown_table().splitlines()[0]
    '| variable | values | what it does |'
    """
    rows = ["| variable | values | what it does |", "|---|---|---|"]
    rows += [f"| `{v.name}` | {v.values} | {v.meaning} |" for v in map(_as_shown, VARIABLES)]
    return "\n".join(rows)
