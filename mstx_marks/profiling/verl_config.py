"""verl profiler overrides (verl 0.9.x) written and checked for you.

:func:`verl_overrides` returns the Hydra ``key=value`` strings that turn on verl's NPU profiler
(MSTX ranges included) for chosen steps, roles and ranks, in verl's own spelling.
:func:`check_verl_overrides` reads such a list, or a whole launch script, and reports each
problem with the line it came from, including the traps verl itself lets through silently.

>>> for line in verl_overrides(steps=[1, 2], save_path="/tmp/prof", roles=["actor"], ranks=[0]):
...     print(line)
global_profiler.tool=npu
global_profiler.steps=[1,2]
global_profiler.save_path=/tmp/prof
actor_rollout_ref.actor.profiler.enable=True
actor_rollout_ref.actor.profiler.ranks=[0]
actor_rollout_ref.actor.profiler.tool_config.npu.contents=[npu,cpu]
actor_rollout_ref.rollout.profiler.enable=False
"""

from __future__ import annotations

import functools
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple, Union

from mstx_marks.base import env
from mstx_marks.base.checks import check_bool, check_ints, check_names
from mstx_marks.profiling.options import CONTENTS, LEVELS

__all__ = [
    "CONTENTS",
    "LEVELS",
    "ROLES",
    "VerlProblem",
    "check_verl_overrides",
    "verl_overrides",
]

ROLES: Dict[str, str] = {
    "actor": "actor_rollout_ref.actor.profiler",
    "ref": "actor_rollout_ref.ref.profiler",
    "rollout": "actor_rollout_ref.rollout.profiler",
    "critic": "critic.profiler",
}
TOOLS = ("nsys", "npu", "torch", "torch_memory", "precision_debugger")
ENGINES = ("vllm", "sglang")
_SAFE_VALUE = re.compile(r"[A-Za-z0-9_/.+\-]+\Z")


def _bool(value: object, what: str) -> bool:
    return check_bool(
        value, what, "verl takes anything else as a string, and a non-empty one is true"
    )


def _looks_typed(text: str) -> bool:
    """Whether Hydra would read bare ``text`` as a bool, null or number instead of a string."""
    if text.lower() in ("true", "false", "null", "inf", "+inf", "-inf", "nan"):
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def _hydra(value: Union[bool, int, str, Sequence[Union[int, str]]]) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if _SAFE_VALUE.match(value) and not _looks_typed(value):
            return value
        if "'" in value or "\\" in value:
            raise ValueError(f"path {value!r} must not contain a quote or a backslash")
        return f"'{value}'"
    return "[" + ",".join(_hydra(v) for v in value) + "]"


def verl_overrides(
    *,
    steps: Sequence[int],
    save_path: str = "outputs/profile",
    roles: Sequence[str] = ("actor", "ref", "rollout"),
    ranks: Optional[Sequence[int]] = None,
    all_ranks: bool = False,
    level: Optional[str] = None,
    contents: Optional[Sequence[str]] = None,
    discrete: Optional[bool] = None,
    analysis: Optional[bool] = None,
    token_window: Optional[Tuple[int, int]] = None,
    tool: str = "npu",
    engine: Optional[str] = None,
    continuous: bool = False,
    uses_reference: Optional[bool] = None,
    uses_critic: Optional[bool] = None,
) -> List[str]:
    """The Hydra overrides that profile ``steps`` of a verl job on NPU, MSTX ranges included.

    ``roles``: actor, ref, rollout, critic. ``ranks`` (global ranks for actor, ref and critic;
    for rollout, replica ranks: verl selects rollout servers by replica, as the guide says) or
    ``all_ranks``; neither means verl's default, rank 0. ``level`` and ``analysis`` left
    ``None`` keep verl's defaults;
    ``contents`` defaults to ``[npu, cpu]`` (what ``[]`` meant up to verl 0.9.0; from 0.9.1 the
    default ``[]`` requests no NPU activity and so collects no MSTX) and must list ``npu``.
    ``discrete=None`` means True when rollout is profiled (it needs it), else verl's
    default. ``token_window=(start, stop)`` limits rollout profiling to those response tokens.
    ``engine`` ("vllm"/"sglang"), ``uses_reference`` (KL loss or KL in reward) and
    ``uses_critic``, when given, let the traps that depend on the job be caught here.
    Actor profiling also turns on rollout profiling in verl; when rollout is not among ``roles``
    it is switched off explicitly.

    >>> verl_overrides(steps=[3], roles=["rollout"], token_window=(0, 64))[-3:]
    ... # doctest: +NORMALIZE_WHITESPACE
    ['actor_rollout_ref.rollout.profiler.tool_config.npu.discrete=True',
     'actor_rollout_ref.rollout.profiler.tool_config.npu.profile_token_start=0',
     'actor_rollout_ref.rollout.profiler.tool_config.npu.profile_token_end=64']
    >>> verl_overrides(steps=5)
    Traceback (most recent call last):
    ...
    TypeError: steps must be a list of ints, got int 5
    """
    # Long by design: one check per argument, each raising with the rule verl enforces later,
    # then the overrides in verl's key order; splitting it scatters the rules.
    if tool != "npu":
        hint = "an unknown tool silently disables profiling" if tool not in TOOLS else ""
        raise ValueError(
            f"tool {tool!r}: these overrides configure tool_config.npu, which verl ignores unless "
            f"tool is 'npu'" + (f"; {hint}" if hint else "")
        )
    step_list = check_ints(steps, "steps", 1)
    if not step_list:
        raise ValueError("steps must list at least one step (an empty or null list profiles none)")
    if not isinstance(save_path, str) or not save_path:
        raise ValueError(f"save_path must be a non-empty str, got {save_path!r}")
    role_list = check_names(roles, "roles", tuple(ROLES))
    if not role_list:
        raise ValueError("roles must name at least one of " + ", ".join(ROLES))
    _bool(all_ranks, "all_ranks")
    rank_list = None if ranks is None else check_ints(ranks, "ranks", 0)
    if all_ranks and rank_list:
        raise ValueError(f"ranks {rank_list} and all_ranks=True conflict: pick one")
    if level is not None and level not in LEVELS:
        raise ValueError(f"level {level!r} must be one of {', '.join(LEVELS)}")
    content_list = (
        list(_DEFAULT_CONTENTS) if contents is None else check_names(contents, "contents", CONTENTS)
    )
    if "npu" not in content_list:
        raise ValueError(f"contents {content_list!r}: {_NO_NPU_CONTENTS} add 'npu'")
    if analysis is not None:
        _bool(analysis, "analysis")
    _bool(continuous, "continuous")
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"engine {engine!r} must be one of {', '.join(ENGINES)}")
    rollout = "rollout" in role_list
    if discrete is None:
        discrete = True if rollout else None
    elif not _bool(discrete, "discrete") and rollout:
        raise ValueError("rollout profiling needs discrete=True (verl collects nothing otherwise)")
    if continuous and discrete:
        raise ValueError("continuous=True (profile_continuous_steps) needs discrete=False")
    if token_window is not None:
        if not rollout:
            raise ValueError(f"token_window {token_window!r} applies only to the rollout role")
        if not isinstance(token_window, Sequence) or isinstance(token_window, (str, bytes)):
            raise TypeError(f"token_window {token_window!r} must be (start, stop)")
        if len(token_window) != 2:
            raise ValueError(f"token_window {token_window!r} must be (start, stop)")
        for bound in token_window:
            check_ints([bound], "token_window", 0)
        if token_window[1] <= token_window[0]:
            raise ValueError(f"token_window {token_window!r} needs stop > start")
    if (
        rollout
        and engine in ("vllm", "sglang")
        and role_list == ["rollout"]
        and (level or analysis is not None)
    ):
        who = "vLLM" if engine == "vllm" else "SGLang (it reads contents and the token window only)"
        raise ValueError(f"{who} ignores level and analysis: they have no effect on rollout")
    if rollout and engine == "sglang" and content_list and "memory" in content_list:
        raise ValueError("SGLang cannot collect memory: drop 'memory' from contents")
    if "ref" in role_list and uses_reference is False:
        raise ValueError(
            "role 'ref' is profiled only when the job has a reference policy "
            "(actor_rollout_ref.actor.use_kl_loss=True or algorithm.use_kl_in_reward=True)"
        )
    if "critic" in role_list and uses_critic is False:
        raise ValueError("role 'critic' is profiled only when a critic runs (critic.enable / gae)")

    out = [
        f"global_profiler.tool={tool}",
        f"global_profiler.steps={_hydra(step_list)}",
        f"global_profiler.save_path={_hydra(save_path)}",
    ]
    if continuous:
        out.append("global_profiler.profile_continuous_steps=True")
    for role in role_list:
        p = ROLES[role]
        out.append(f"{p}.enable=True")
        if all_ranks:
            out.append(f"{p}.all_ranks=True")
        elif rank_list:
            out.append(f"{p}.ranks={_hydra(rank_list)}")
        npu = f"{p}.tool_config.npu"
        out.append(f"{npu}.contents={_hydra(content_list)}")
        if not (role == "rollout" and engine == "vllm"):
            if level is not None:
                out.append(f"{npu}.level={level}")
            if analysis is not None:
                out.append(f"{npu}.analysis={_hydra(analysis)}")
        if discrete is not None:
            out.append(f"{npu}.discrete={_hydra(discrete)}")
        if role == "rollout" and token_window is not None:
            out.append(f"{npu}.profile_token_start={token_window[0]}")
            out.append(f"{npu}.profile_token_end={token_window[1]}")
    if "actor" in role_list and not rollout:
        out.append(f"{ROLES['rollout']}.enable=False")
    return out


_DEFAULT_CONTENTS = ("npu", "cpu")
# verl 0.9.1 changed `contents: []` from "everything" to "CPU only" (see the module docstring).
_NO_NPU_CONTENTS = (
    "from verl 0.9.1 a profiler whose contents lack 'npu' requests no NPU activity, so torch_npu"
    " ignores msprof_tx and no MSTX range is collected (the default contents: [] is such a list);"
)


class VerlProblem(NamedTuple):
    """One problem found by :func:`check_verl_overrides`: line number, override, message."""

    line: int
    text: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.text}: {self.message}"


_KEY = re.compile(r"(?P<prefix>\+\+|\+)?(?P<key>[A-Za-z_][\w\-]*(?:\.[\w\-]+)+)=(?P<value>.*)\Z")
# Hydra's deletion, ``~key`` or ``~key=value``: it sets nothing, so it is not checked as a value.
_DELETE = re.compile(r"~[A-Za-z_][\w\-]*(?:\.[\w\-]+)+(?:=.*)?\Z")
# Hydra's INT (a leading zero makes a string: ``01`` stays '01').
_INT = re.compile(r"[+-]?(?:0|[1-9](?:_?[0-9])*)\Z")
_COMMON = {"enable", "all_ranks", "ranks", "tool", "save_path", "relocate_results"}
_COMMON |= {"finish_hook_cmd", "finish_hook_all_ranks", "finish_hook_ranks"}
_GLOBAL = {"tool", "steps", "profile_continuous_steps", "save_path", "relocate_results"}
_GLOBAL |= {"finish_hook_cmd", "finish_hook_all_ranks", "finish_hook_ranks"}
_NPU = {"contents", "level", "analysis", "discrete"}
_TOKEN_WINDOW = {"profile_token_start", "profile_token_end"}
_BOOLS = {"enable", "all_ranks", "analysis", "discrete", "profile_continuous_steps"}
_BOOLS |= {"relocate_results", "finish_hook_all_ranks"}
# Keys whose default is null: Hydra lets ``+key=value`` add those, and fails on every other key
# verl already defines ("Could not append to config").
_NULL_BY_DEFAULT = {"tool", "steps", "finish_hook_cmd", "profile_token_start", "profile_token_end"}


class _FromShell:
    """The value of an override taken from a shell variable: unknown until the script runs."""

    def __repr__(self) -> str:
        return "$..."


_SHELL = _FromShell()
_Value = Union[None, bool, int, float, str, List[object], _FromShell]
_Report = Callable[[str], None]
_JobReport = Callable[[int, str, str], None]


def _parse(text: str) -> _Value:
    """A Hydra override value, as far as the checks need it."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "null":
        return None
    if _INT.match(text):
        return int(text)
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_parse(part) for part in inner.split(",")] if inner else []
    return text


def _script_overrides(script: str) -> List[Tuple[int, str]]:
    found: List[Tuple[int, str]] = []
    for number, line in enumerate(script.splitlines(), 1):
        body = line.rstrip()
        body = body[:-1] if body.endswith("\\") else body
        try:
            words = shlex.split(body, comments=True)
        except ValueError:
            continue
        found.extend((number, w) for w in words if _KEY.match(w))
    return found


#: Where verl's ``main_ppo`` takes Ray's runtime_env from the command line.
RUNTIME_ENV = "ray_kwargs.ray_init.runtime_env."
#: The worker_process_setup_hook values that activate mstx_marks (Ray wants ``module.function``).
SETUP_HOOKS = ("mstx_marks.activate", "mstx_marks.launch.activate.activate")
#: Checks ``MSTX_MARKS_*`` values as the run-time reads them: one message per problem.
EnvCheck = Callable[[Dict[str, str]], List[str]]


def _check_runtime_env(
    rest: str, value: _Value, report: _Report, check_env: Optional[EnvCheck]
) -> None:
    """``+ray_kwargs.ray_init.runtime_env.REST=VALUE``: what mstx_marks' activation reads there."""
    if rest == "worker_process_setup_hook":
        text = str(value)
        if ":" in text:
            report(f"Ray refuses the module:function form; write {SETUP_HOOKS[0]}")
        elif text.startswith("mstx_marks") and text not in SETUP_HOOKS:
            report(f"mstx_marks has no hook {text!r}; the hook is {SETUP_HOOKS[0]}")
        return
    name = rest[len("env_vars.") :] if rest.startswith("env_vars.") else ""
    if not name.startswith("MSTX_MARKS_"):
        return
    if name not in {v.name for v in env.VARIABLES}:
        known = ", ".join(v.name for v in env.VARIABLES)
        report(f"{name} is not an mstx_marks variable (known: {known})")
    elif check_env is not None and value is not _SHELL:
        for message in check_env({name: "" if value is None else str(value)}):
            report(message)


def check_verl_overrides(
    overrides: Union[str, Sequence[str]],
    check_env: Optional[EnvCheck] = None,
) -> List[VerlProblem]:
    """Check verl profiler overrides: a list of ``key=value`` strings, or a launch script's text.

    Returns one :class:`VerlProblem` per problem (empty when all is well), with the line it
    came from (for a list, its position from 1). Values taken from shell variables are not
    checked. Effective values follow verl: rollout inherits enable, ranks and tool_config.npu
    from the actor unless set. The ``MSTX_MARKS_*`` variables given to Ray's workers
    (``+ray_kwargs.ray_init.runtime_env.env_vars.NAME``) must be known, and their values pass
    ``check_env`` when given; a ``worker_process_setup_hook`` must be one Ray and we accept.

    >>> for p in check_verl_overrides(["global_profiler.steps=3", "critic.profiler.enable=yes"]):
    ...     print(p)
    line 1: global_profiler.steps=3: steps must be a list of steps >= 1 (a bare int crashes later)
    line 2: critic.profiler.enable=yes: must be True or False; verl keeps 'yes' as a string
    """
    if isinstance(overrides, str):
        items = _script_overrides(overrides)
    else:
        items = [(i, o) for i, o in enumerate(overrides, 1)]
    problems: List[VerlProblem] = []
    seen: Dict[str, Tuple[int, str, _Value]] = {}

    def report(line: int, text: str, message: str) -> None:
        problems.append(VerlProblem(line, text, message))

    for line, text in items:
        m = _KEY.match(text)
        if m is None:
            if not _DELETE.match(text):
                report(line, text, "not a key=value override")
            continue
        key, raw = m.group("key"), m.group("value")
        if "$" in raw:
            # Known to be set, value unknown: the rules that need the value are skipped.
            seen[key] = (line, text, _SHELL)
            continue
        value = _parse(raw)
        seen[key] = (line, text, value)
        if key.startswith(RUNTIME_ENV):
            where = functools.partial(report, line, text)
            _check_runtime_env(key[len(RUNTIME_ENV) :], value, where, check_env)
            continue
        _check_one(key, value, functools.partial(report, line, text))
        leaf = key.rsplit(".", 1)[-1]
        if m.group("prefix") == "+" and _is_verl_key(key) and leaf not in _NULL_BY_DEFAULT:
            report(
                line,
                text,
                f"'+' adds a new key but verl already sets {key!r}: Hydra fails with "
                f"'Could not append to config'; drop the '+' (or use '++')",
            )
    _check_job(seen, report)
    return sorted(problems, key=lambda p: p.line)


def _check_one(key: str, value: _Value, report: _Report) -> None:
    leaf = key.rsplit(".", 1)[-1]
    if key.startswith("global_profiler."):
        rest = key[len("global_profiler.") :]
        if rest not in _GLOBAL and not rest.startswith("global_tool_config."):
            report(f"unknown key {key!r} (verl's strict config rejects it)")
        elif rest == "tool" and value not in TOOLS:
            report(f"tool {value!r} is not one of {', '.join(TOOLS)}; verl silently disables it")
        elif rest == "steps":
            if value is None:
                report("steps=null disables profiling altogether")
            elif not isinstance(value, list):
                report("steps must be a list of steps >= 1 (a bare int crashes later)")
            elif not value or any(_not_int(v) or v < 1 for v in value):  # type: ignore[operator]
                report("steps must be a non-empty list of ints >= 1 (steps count from 1)")
        elif leaf in _BOOLS and not isinstance(value, bool):
            report(_not_bool(value))
        return
    role = next((r for r, p in ROLES.items() if key.startswith(p + ".")), None)
    if role is None:
        return
    rest = key[len(ROLES[role]) + 1 :]
    if rest.startswith("tool_config.") and not rest.startswith("tool_config.npu."):
        return
    npu = rest[len("tool_config.npu.") :] if rest.startswith("tool_config.npu.") else None
    if npu in ("profile_token_start", "profile_token_end"):
        if role != "rollout":
            report(f"{npu} exists only under the rollout role")
        elif value is not None and (_not_int(value) or value < 0):  # type: ignore[operator]
            report(f"{npu} must be an int >= 0 or null")
        return
    if (npu is None and rest not in _COMMON) or (npu is not None and npu not in _NPU):
        report(f"unknown key {key!r} (verl's strict config rejects it)")
    elif leaf in _BOOLS and not isinstance(value, bool):
        report(_not_bool(value))
    elif rest == "tool" and value not in TOOLS:
        report(f"tool {value!r} is not one of {', '.join(TOOLS)}; verl silently disables it")
    elif rest == "ranks" and (
        not isinstance(value, list) or any(_not_int(v) or v < 0 for v in value)  # type: ignore[operator]
    ):
        report("ranks must be a list of ints >= 0, e.g. [0,1]")
    elif npu == "level" and value not in LEVELS:
        report(f"level {value!r} must be one of {', '.join(LEVELS)}")
    elif npu == "contents" and (
        not isinstance(value, list) or any(v not in CONTENTS for v in value)
    ):
        report(f"contents must be a list of {', '.join(CONTENTS)}")


def _not_int(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


def _not_bool(value: _Value) -> str:
    kind = "a string" if isinstance(value, str) else "null" if value is None else "a number"
    return f"must be True or False; verl keeps {value!r} as {kind}"


def _is_verl_key(key: str) -> bool:
    """Whether verl's profiler config already defines ``key`` (the checks know no other keys)."""
    if key.startswith("global_profiler."):
        return key[len("global_profiler.") :] in _GLOBAL
    role = next((p for p in ROLES.values() if key.startswith(p + ".")), None)
    if role is None:
        return False
    rest = key[len(role) + 1 :]
    if rest.startswith("tool_config.npu."):
        return rest[len("tool_config.npu.") :] in _NPU | _TOKEN_WINDOW
    return rest in _COMMON


_NPU_KEYS = "tool_config.npu."


class _Job:
    """The overrides seen, read as verl reads them: rollout's profiler takes the actor's
    ``enable``, ``ranks`` and ``tool_config.npu`` values unless its own are set (verl's
    ``rollout.yaml``, ``${oc.select:actor_rollout_ref.actor.profiler...}``). Each lookup also
    says where a value comes from: the override that set it, or verl's default."""

    def __init__(self, seen: Dict[str, Tuple[int, str, _Value]]) -> None:
        self.seen = seen

    def get(self, key: str, default: _Value = None) -> _Value:
        return self.seen[key][2] if key in self.seen else default

    def keys(self, role: str, rest: str) -> Tuple[str, ...]:
        """Where ``role``'s ``rest`` is read from, in verl's order."""
        own = f"{ROLES[role]}.{rest}"
        return (own, f"{ROLES['actor']}.{rest}") if role == "rollout" else (own,)

    def role_get(self, role: str, rest: str, default: _Value = None) -> _Value:
        key = next((k for k in self.keys(role, rest) if k in self.seen), None)
        return default if key is None else self.seen[key][2]

    def is_set(self, role: str, rest: str) -> bool:
        return any(k in self.seen for k in self.keys(role, rest))

    def where(self, *keys: str) -> Tuple[int, str]:
        """The line and text of the first of ``keys`` set (the callers name one that is)."""
        for key in keys:
            if key in self.seen:
                return self.seen[key][0], self.seen[key][1]
        return 0, "(not set)"

    def profiled(self) -> List[str]:
        """The roles verl profiles. Rollout's ``enable`` follows the actor's, but its servers
        drive the engine's profiler only in discrete mode (``_should_profile``), so a rollout
        enabled by the actor alone, not discrete, profiles nothing: no rule of its applies."""
        roles = [r for r in ROLES if self.role_get(r, "enable", False) is True]
        if "rollout" in roles and f"{ROLES['rollout']}.enable" not in self.seen:
            discrete = self.role_get("rollout", _NPU_KEYS + "discrete", False)
            if discrete is not _SHELL and not discrete:  # verl takes any truthy value
                roles.remove("rollout")
        return roles


def _check_job(seen: Dict[str, Tuple[int, str, _Value]], report: _JobReport) -> None:
    """The rules that span several overrides. Each finding names the override that causes it;
    one that comes from a default verl fills in names the line that asks for profiling and
    says which default."""
    job = _Job(seen)
    _check_token_window(job, report)
    profiled = job.profiled()
    if not profiled:
        return
    first = job.where(*(k for r in profiled for k in job.keys(r, "enable")))
    tool = job.get("global_profiler.tool")
    if tool is None:
        report(
            *first, "global_profiler.tool is not set (verl's default: null): verl profiles nothing"
        )
    npu_keys = [k for k in seen if ".tool_config.npu." in k]
    if tool not in (None, "npu", _SHELL) and npu_keys:
        report(
            *job.where(npu_keys[0]),
            f"tool_config.npu.* is ignored: global_profiler.tool is {tool!r}",
        )
    if "global_profiler.steps" not in seen:
        report(
            *first, "global_profiler.steps is not set (verl's default: null): verl profiles no step"
        )
    if "rollout" in profiled:
        _check_rollout(job, report)
    if tool in ("npu", None):
        for r in profiled:
            _check_contents(job, r, report)
    _check_roles_run(job, profiled, report)
    if job.get("global_profiler.profile_continuous_steps") is True:
        for r in profiled:
            if job.role_get(r, _NPU_KEYS + "discrete") is True:
                report(
                    *job.where(*job.keys(r, _NPU_KEYS + "discrete")),
                    "profile_continuous_steps needs discrete=False",
                )


def _check_rollout(job: _Job, report: _JobReport) -> None:
    """The rules of a profiled rollout: discrete mode, and what its engine reads."""
    npu = _NPU_KEYS
    if job.role_get("rollout", npu + "discrete") not in (True, _SHELL):
        if job.is_set("rollout", npu + "discrete"):
            report(
                *job.where(*job.keys("rollout", npu + "discrete")),
                "rollout profiling needs tool_config.npu.discrete=True",
            )
        else:
            report(
                *job.where(f"{ROLES['rollout']}.enable"),
                "rollout profiling needs tool_config.npu.discrete=True (verl's default: False)",
            )
    engine = job.get("actor_rollout_ref.rollout.name")
    if engine in ("vllm", "sglang"):
        name = "vLLM" if engine == "vllm" else "SGLang (it reads contents and the token window)"
        for k in ("level", "analysis"):
            if f"{ROLES['rollout']}.{npu}{k}" in job.seen:
                report(*job.where(f"{ROLES['rollout']}.{npu}{k}"), f"{name} ignores {k}")
    contents = job.role_get("rollout", npu + "contents", [])
    if engine == "sglang" and isinstance(contents, list) and "memory" in contents:
        report(
            *job.where(*job.keys("rollout", npu + "contents")),
            "SGLang cannot collect memory: drop it from rollout contents",
        )


def _check_contents(job: _Job, role: str, report: _JobReport) -> None:
    """From verl 0.9.1 a profiler collects MSTX only when its contents list ``npu``."""
    rest = _NPU_KEYS + "contents"
    contents = job.role_get(role, rest)
    if contents is _SHELL or (isinstance(contents, list) and "npu" in contents):
        return
    fix = f"add {ROLES[role]}.{rest}=[npu,cpu]"
    if job.is_set(role, rest):
        report(*job.where(*job.keys(role, rest)), f"{role}: {_NO_NPU_CONTENTS} {fix}")
        return
    report(
        *job.where(*job.keys(role, "enable")),
        f"{role}: contents is not set (verl's default: []); {_NO_NPU_CONTENTS} {fix}",
    )


def _check_roles_run(job: _Job, profiled: List[str], report: _JobReport) -> None:
    """A profiled ref or critic needs the job to run one."""
    kl = (job.get("actor_rollout_ref.actor.use_kl_loss"), job.get("algorithm.use_kl_in_reward"))
    if "ref" in profiled and True not in kl and _SHELL not in kl:
        report(
            *job.where(f"{ROLES['ref']}.enable"),
            "ref is profiled only with a reference policy "
            "(actor_rollout_ref.actor.use_kl_loss=True or algorithm.use_kl_in_reward=True)",
        )
    critic = job.get("critic.enable")
    if "critic" in profiled and (
        critic is False
        or (
            critic is None
            and "algorithm.adv_estimator" in job.seen
            and job.get("algorithm.adv_estimator") not in ("gae", _SHELL)
        )
    ):
        report(
            *job.where("critic.profiler.enable"),
            "no critic runs in this job (critic.enable / gae)",
        )


def _check_token_window(job: _Job, report: _JobReport) -> None:
    """verl's NPUToolConfig (0.9.1 config.py 245-246) refuses end <= start at start-up, whether
    or not profiling is on: a reversed or empty window is an error here too."""
    npu = _NPU_KEYS
    start = job.role_get("rollout", npu + "profile_token_start")
    stop = job.role_get("rollout", npu + "profile_token_end")
    if isinstance(start, int) and isinstance(stop, int) and stop <= start:
        report(
            *job.where(*job.keys("rollout", npu + "profile_token_end")),
            f"profile_token_end={stop} must be > profile_token_start={start}"
            " (verl refuses an empty or reversed token window at start-up)",
        )


def check_verl_inputs(inputs: Sequence[str], check_env: Optional[EnvCheck] = None) -> int:
    """Check launch scripts (paths, ``-`` for stdin) and ``key=value`` overrides; print one
    problem a line, or one line saying what was checked when all is well. Returns 0 when there
    is no problem, 1 when there are, 2 when an input cannot be read."""
    overrides = [a for a in inputs if _KEY.match(a) or _DELETE.match(a)]
    found = checked = 0
    for source in (a for a in inputs if a not in overrides):
        try:
            text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
        except OSError as err:
            print(f"error: cannot read {source!r}: {err}", file=sys.stderr)
            return 2
        checked += len(_script_overrides(text))
        for problem in check_verl_overrides(text, check_env):
            print(f"{source}:{problem}")
            found += 1
    if overrides:
        checked += len(overrides)
        for problem in check_verl_overrides(overrides, check_env):
            print(problem)
            found += 1
    if not found:
        if checked:
            print(f"ok: {checked} verl override(s) checked, no problem found")
        else:
            print("ok: no verl profiler override found (nothing to check)")
    return 1 if found else 0
