"""``profiler_config.json`` for torch_npu's dynamic profiler, MSTX on, written atomically.

A job that calls ``torch_npu.profiler.dynamic_profile.init(path)`` and ``step()`` each iteration
starts profiling when ``<path>/profiler_config.json`` changes. torch_npu resets or ignores most bad
values with a log line; :func:`dynamic_profile_config` checks them first, and
:func:`check_dynamic_profile_config` reports what is wrong in an existing file.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> cfg = dynamic_profile_config(d, start_step=10, active=2, prof_dir="/tmp/prof")
>>> cfg["experimental_config"]["mstx"], check_dynamic_profile_config(d)
(True, [])
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from mstx_marks.base.checks import check_int
from mstx_marks.export.files import atomic_path
from mstx_marks.profiling.options import AIC_METRICS, LEVEL_WORDS
from mstx_marks.profiling.profiler import experimental_config

__all__ = ["CONFIG_NAME", "check_dynamic_profile_config", "dynamic_profile_config"]

CONFIG_NAME = "profiler_config.json"
# torch_npu copies the file into a 1 MiB shared buffer after a 4-byte timestamp.
_MAX_BYTES = 1024 * 1024 - 4
_ACTIVITIES = ("CPU", "NPU")
_TOP_BOOLS: Tuple[str, ...] = ("analyse", "async_mode", "record_shapes", "profile_memory")
_TOP_BOOLS += ("with_stack", "with_flops", "with_modules", "is_rank")
_TOP_KEYS = set(_TOP_BOOLS) | {"activities", "prof_dir", "active", "warmup", "start_step"}
_TOP_KEYS |= {"rank_list", "experimental_config", "metadata"}
_EXP_KEYS = {"profiler_level", "aic_metrics", "l2_cache", "op_attr", "gc_detect_threshold"}
_EXP_KEYS |= {"data_simplification", "record_op_args", "export_type", "msprof_tx", "mstx"}
_EXP_KEYS |= {"host_sys", "mstx_domain_include", "mstx_domain_exclude", "sys_io"}
_EXP_KEYS |= {"sys_interconnection"}
_AIC_NAMES = {value: name for name, value in AIC_METRICS.items()}
# torch_npu's own default file lists every key; ours does too, so it reads the same way.
_EXP_DEFAULTS: Dict[str, Any] = {
    "l2_cache": False,
    "op_attr": False,
    "gc_detect_threshold": None,
    "data_simplification": True,
    "record_op_args": False,
    "msprof_tx": False,
    "mstx": False,
    "host_sys": [],
    "mstx_domain_include": [],
    "mstx_domain_exclude": [],
    "sys_io": False,
    "sys_interconnection": False,
}


def _file(path: Union[str, os.PathLike[str]]) -> Path:
    p = Path(path)
    return p if p.name.endswith(".json") else p / CONFIG_NAME


def dynamic_profile_config(
    path: Union[str, os.PathLike[str]],
    *,
    start_step: int = -1,
    active: int = 1,
    warmup: int = 0,
    prof_dir: str = "./",
    activities: Sequence[str] = _ACTIVITIES,
    analyse: bool = False,
    async_mode: bool = False,
    record_shapes: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
    with_flops: bool = False,
    with_modules: bool = False,
    ranks: Optional[Iterable[int]] = None,
    metadata: Optional[Mapping[str, Any]] = None,
    **experimental: Any,
) -> Dict[str, Any]:
    """Write ``profiler_config.json`` in directory ``path`` (or to ``path`` ending in .json).

    ``start_step=-1`` starts at the next step after the file is read; otherwise the step number
    (>= 1: torch_npu counts from 1, and a start step already passed is dropped). ``ranks``: only
    these global ranks profile. ``experimental`` takes :func:`~mstx_marks.profiling.profiler.
    experimental_config`'s arguments (level, export, include, exclude, aic_metrics...). The file
    is replaced atomically, with a modification time torch_npu's monitor (which compares whole
    seconds) sees as new. Returns the written mapping.
    """
    if not isinstance(start_step, int) or isinstance(start_step, bool) or start_step == 0:
        raise ValueError(f"start_step {start_step!r} must be -1 (next step) or a step >= 1")
    check_int(start_step, "start_step", -1)
    acts = list(activities) if not isinstance(activities, str) else [activities]
    if not acts or any(a not in _ACTIVITIES for a in acts) or len(set(acts)) != len(acts):
        raise ValueError(f"activities {activities!r} must be distinct names from CPU, NPU")
    if not isinstance(prof_dir, str) or not prof_dir:
        raise ValueError(f"prof_dir must be a non-empty str, got {prof_dir!r}")
    flags = {
        "analyse": analyse,
        "async_mode": async_mode,
        "record_shapes": record_shapes,
        "profile_memory": profile_memory,
        "with_stack": with_stack,
        "with_flops": with_flops,
        "with_modules": with_modules,
    }
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{key} must be True or False, got {type(value).__name__} {value!r}")
    if async_mode and not analyse:
        raise ValueError("async_mode=True has no effect unless analyse=True")
    if ranks is not None and analyse and not async_mode:
        raise ValueError(
            f"analyse=True with ranks={ranks!r} needs async_mode=True: torch_npu turns analysis "
            "off on the listed ranks otherwise"
        )
    rank_list: List[int] = []
    if ranks is not None:
        if isinstance(ranks, (int, str)):
            raise TypeError(f"ranks must be a list of ints, got {ranks!r}")
        rank_list = sorted({check_int(r, "ranks entry", 0) for r in ranks})
        if not rank_list:
            raise ValueError("ranks must name at least one rank (or be None for every rank)")
    exp = experimental_config(**experimental)
    export = exp["export_type"]
    exp_json: Dict[str, Any] = {**_EXP_DEFAULTS, **exp}
    exp_json["aic_metrics"] = _AIC_NAMES[exp["aic_metrics"]]
    exp_json["export_type"] = export if isinstance(export, list) else [export]
    data: Dict[str, Any] = {
        "activities": acts,
        "prof_dir": prof_dir,
        **flags,
        "active": check_int(active, "active", 1),
        "warmup": check_int(warmup, "warmup", 0),
        "start_step": start_step,
        "is_rank": ranks is not None,
        "rank_list": rank_list,
        "experimental_config": exp_json,
    }
    if metadata is not None:
        data["metadata"] = dict(metadata)
    text = json.dumps(data, indent=4) + "\n"
    if len(text.encode()) > _MAX_BYTES:
        raise ValueError(f"config is {len(text.encode())} bytes; torch_npu reads at most 1 MiB")
    _write_atomically(_file(path), text)
    return data


def _write_atomically(target: Path, text: str) -> None:
    try:
        old_mtime: int | None = int(target.stat().st_mtime)
    except FileNotFoundError:
        old_mtime = None
    with atomic_path(target) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # torch_npu only notices a change of whole seconds, and may not have read the previous
        # version yet: never go back to a second an earlier version may have had.
        if old_mtime is not None and int(os.stat(tmp).st_mtime) <= old_mtime:
            os.utime(tmp, (old_mtime + 1, old_mtime + 1))


def check_dynamic_profile_config(
    source: Union[str, os.PathLike[str], Mapping[str, Any]],
) -> List[str]:
    """What torch_npu would reset, ignore or warn about in a dynamic-profile config.

    ``source``: the directory, the JSON file, or the parsed mapping. An empty list means the
    config runs as written, with MSTX on.

    >>> check_dynamic_profile_config({"start_step": 0, "activities": ["GPU"], "warmup": 1})
    ... # doctest: +NORMALIZE_WHITESPACE
    ['activities: GPU is not CPU or NPU (dropped)',
     'start_step 0 never starts: use -1 (next step) or a step >= 1',
     'experimental_config is missing: MSTX is off']
    """
    if isinstance(source, Mapping):
        data: Any = source
    else:
        try:
            data = json.loads(_file(source).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            return [f"cannot read {_file(source)}: {err}"]
    if not isinstance(data, Mapping):
        return ["the config must be a JSON object"]
    problems = [f"unknown key {k!r} (ignored)" for k in data if k not in _TOP_KEYS]
    acts = data.get("activities")
    if not isinstance(acts, list) or not acts:
        problems.append("activities must be a non-empty list of CPU, NPU")
    else:
        problems += [
            f"activities: {a} is not CPU or NPU (dropped)"
            for a in acts
            if not isinstance(a, str) or a.upper() not in _ACTIVITIES
        ]
    for key in _TOP_BOOLS:
        if key in data and not isinstance(data[key], bool):
            problems.append(f"{key} must be true or false, got {data[key]!r}")
    for key, low in (("active", 1), ("warmup", 0)):
        v = data.get(key, low)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            problems.append(f"{key} must be an int >= {low}, got {v!r} (reset)")
    step = data.get("start_step", 0)
    if isinstance(step, bool) or not isinstance(step, int) or step < -1 or step == 0:
        problems.append(f"start_step {step!r} never starts: use -1 (next step) or a step >= 1")
    if data.get("is_rank") is True:
        ranks = data.get("rank_list")
        if not isinstance(ranks, list) or not ranks:
            problems.append(
                "is_rank is true but rank_list is not a non-empty list: no rank profiles"
            )
        elif any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks):
            problems.append(f"rank_list {ranks!r} must hold ints >= 0 (others are dropped)")
        if data.get("analyse") is True and data.get("async_mode") is not True:
            problems.append(
                "analyse is true with is_rank but async_mode is not: torch_npu turns analysis off"
            )
    if data.get("async_mode") is True and data.get("analyse") is not True:
        problems.append("async_mode has no effect unless analyse is true")
    problems += _check_experimental(data.get("experimental_config"))
    return problems


def _check_experimental(exp: Any) -> List[str]:
    if not exp:
        return ["experimental_config is missing: MSTX is off"]
    if not isinstance(exp, Mapping):
        return ["experimental_config must be a JSON object"]
    problems = [
        f"experimental_config: unknown key {k!r} (ignored)" for k in exp if k not in _EXP_KEYS
    ]
    if exp.get("msprof_tx") is True:
        problems.append("experimental_config: msprof_tx is deprecated, use mstx")
    elif exp.get("mstx") is not True:
        problems.append("experimental_config: mstx is not true: MSTX ranges are not collected")
    level = exp.get("profiler_level", "Level0")
    if not isinstance(level, str) or level not in LEVEL_WORDS:
        # torch_npu looks the name up as written: "level1" is reset to Level0.
        problems.append(
            f"experimental_config: profiler_level {level!r} is not one of "
            f"{', '.join(LEVEL_WORDS)} (reset to Level0)"
        )
        level = "Level0"
    aic = exp.get("aic_metrics", "AiCoreNone")
    export = exp.get("export_type", "text")
    try:
        experimental_config(
            level=LEVEL_WORDS[level],
            export=export,
            include=exp.get("mstx_domain_include") or None,
            exclude=exp.get("mstx_domain_exclude") or None,
            aic_metrics=aic,
            l2_cache=exp.get("l2_cache", False),
            op_attr=exp.get("op_attr", False),
            record_op_args=exp.get("record_op_args", False),
            data_simplification=exp.get("data_simplification", True),
            gc_detect_threshold=exp.get("gc_detect_threshold"),
            host_sys=exp.get("host_sys") or None,
            sys_io=exp.get("sys_io", False),
            sys_interconnection=exp.get("sys_interconnection", False),
            mstx_supported=True,
        )
    except (TypeError, ValueError) as err:
        problems.append(f"experimental_config: {err}")
    for key in ("mstx_domain_include", "mstx_domain_exclude", "host_sys"):
        if exp.get(key) is not None and not isinstance(exp.get(key), list):
            problems.append(f"experimental_config: {key} must be a list (reset otherwise)")
    return problems
