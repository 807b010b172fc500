"""dynamic_profile_config against torch_npu 2.14.0's real ``ConfigContext`` (the JSON reader)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
import zipfile
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support import real_torch_npu
from support.fake_mstx_c import capture_output

from mstx_marks.profiling.dynamic_profile import (
    CONFIG_NAME,
    check_dynamic_profile_config,
    dynamic_profile_config,
)

CONTEXT = "torch_npu/profiler/_dynamic_profiler/_dynamic_profiler_config_context.py"
# torch_npu 2.14.0's own default file (DynamicProfilerShareMemory.JSON_DATA).
TORCH_NPU_DEFAULT = {
    "activities": ["CPU", "NPU"],
    "prof_dir": "./",
    "analyse": False,
    "async_mode": False,
    "record_shapes": False,
    "profile_memory": False,
    "with_stack": False,
    "with_flops": False,
    "with_modules": False,
    "active": 1,
    "warmup": 0,
    "start_step": 0,
    "is_rank": False,
    "rank_list": [],
    "experimental_config": {
        "profiler_level": "Level0",
        "aic_metrics": "AiCoreNone",
        "l2_cache": False,
        "op_attr": False,
        "gc_detect_threshold": None,
        "data_simplification": True,
        "record_op_args": False,
        "export_type": ["text"],
        "msprof_tx": False,
        "mstx": False,
        "host_sys": [],
        "mstx_domain_include": [],
        "mstx_domain_exclude": [],
        "sys_io": False,
        "sys_interconnection": False,
    },
}


class _Utils:
    """Stand-in for ``DynamicProfilerUtils``: rank 3, config-file mode, logs recorded."""

    logs: ClassVar[list[tuple[str, str]]] = []

    class LoggerLevelEnum:
        INFO, WARNING, ERROR = "INFO", "WARNING", "ERROR"

    @staticmethod
    def is_dyno_model() -> bool:
        return False

    @staticmethod
    def get_rank_id() -> int:
        return 3

    @classmethod
    def out_log(cls, message: str, level: str = "INFO", *args: Any) -> None:
        cls.logs.append((level, message))


@pytest.fixture(scope="module")
def config_context() -> Any:
    """The real ConfigContext; its imports are stubs and the real experimental_config."""
    experimental = real_torch_npu.load_real_experimental_config()
    wheel = real_torch_npu._wheel()
    source = zipfile.ZipFile(wheel).read(CONTEXT)
    activity = types.SimpleNamespace(CPU="CPU", NPU="NPU")
    stubs = {
        "torch_npu": types.ModuleType("torch_npu"),
        "torch_npu._C": types.ModuleType("torch_npu._C"),
        "torch_npu._C._profiler": types.SimpleNamespace(ProfilerActivity=activity),
        "torch_npu.profiler": types.ModuleType("torch_npu.profiler"),
        "torch_npu.profiler.experimental_config": experimental,
        "torch_npu.profiler._dynamic_profiler": types.ModuleType(
            "torch_npu.profiler._dynamic_profiler"
        ),
        "torch_npu.profiler._dynamic_profiler._dynamic_profiler_utils": types.SimpleNamespace(
            DynamicProfilerUtils=_Utils
        ),
    }
    for name in ("torch_npu", "torch_npu.profiler", "torch_npu.profiler._dynamic_profiler"):
        stubs[name].__path__ = []  # type: ignore[union-attr]
    name = CONTEXT[:-3].replace("/", ".")
    saved = {k: sys.modules.get(k) for k in stubs}
    try:
        sys.modules.update(stubs)  # type: ignore[arg-type]
        spec = importlib.util.spec_from_loader(name, loader=None)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        module.__package__ = name.rsplit(".", 1)[0]
        exec(compile(source, CONTEXT, "exec"), module.__dict__)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return module.ConfigContext


def _read(config_context: Any, data: dict[str, Any]) -> Any:
    _Utils.logs.clear()
    with capture_output() as out:
        ctx = config_context({**data, "is_valid": True})
    assert out.warnings == [] and out.lines == [], (out.warnings, out.lines)
    assert [log for log in _Utils.logs if log[0] != "INFO"] == []
    return ctx


def test_torch_npu_reads_the_file_as_written(tmp_path: Path, config_context: Any) -> None:
    data = dynamic_profile_config(
        tmp_path,
        start_step=5,
        active=2,
        warmup=1,
        prof_dir="/tmp/out",
        level="level1",
        export=["db", "text"],
        include=["verl", "default"],
        ranks=[3, 0],
        analyse=True,
        async_mode=True,
        with_stack=True,
        metadata={"job": "grpo"},
    )
    on_disk = json.loads((tmp_path / CONFIG_NAME).read_text())
    assert on_disk == data
    ctx = _read(config_context, on_disk)
    assert set(ctx.activities()) == {"CPU", "NPU"}
    assert (ctx.active(), ctx.warmup(), ctx.start_step()) == (2, 1, 5)
    assert ctx.prof_path == "/tmp/out" and ctx.analyse() is True and ctx.async_mode() is True
    assert ctx.with_stack is True and ctx.record_shapes is False
    assert ctx._rank_set == {0, 3} and ctx.valid() is True  # this (stub) rank is 3
    assert ctx.meta_data() == {"job": "grpo"}
    exp = ctx.experimental_config
    assert exp._profiler_level == "Level1" and exp._aic_metrics == "ACL_AICORE_PIPE_UTILIZATION"
    assert exp._mstx is True and exp._msprof_tx is False
    assert (
        sorted(exp._mstx_domain_include) == ["default", "verl"] and exp._mstx_domain_exclude == []
    )
    assert sorted(exp.export_type) == ["db", "text"]
    assert check_dynamic_profile_config(tmp_path) == []


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"level": "level_none", "exclude": ["communication"], "export": "text"},
        {"level": "level2", "aic_metrics": "MemoryUB", "l2_cache": True, "op_attr": True},
        {"activities": ["NPU"], "start_step": 1, "gc_detect_threshold": 0.5, "host_sys": ["cpu"]},
    ],
)
def test_every_variant_is_read_without_a_warning(
    tmp_path: Path, config_context: Any, args: dict[str, Any]
) -> None:
    data = dynamic_profile_config(tmp_path / "cfg", **args)
    ctx = _read(config_context, data)
    assert ctx.experimental_config._mstx is True
    assert ctx.start() is (data["start_step"] == -1)
    assert check_dynamic_profile_config(tmp_path / "cfg" / CONFIG_NAME) == []


def test_rewrite_is_atomic_and_seen_as_new(tmp_path: Path) -> None:
    target = tmp_path / CONFIG_NAME
    dynamic_profile_config(tmp_path, active=1)
    os.chmod(target, 0o600)
    first = int(target.stat().st_mtime)
    dynamic_profile_config(tmp_path, active=3)
    assert int(target.stat().st_mtime) != first  # torch_npu compares whole seconds
    assert target.stat().st_mode & 0o777 == 0o600  # the file's mode is kept
    assert json.loads(target.read_text())["active"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONFIG_NAME]  # no temp file left


def test_torch_npus_default_file_is_flagged() -> None:
    problems = check_dynamic_profile_config(TORCH_NPU_DEFAULT)
    assert any("start_step 0 never starts" in p for p in problems)
    assert any("mstx is not true" in p for p in problems)
    assert len(problems) == 2, problems


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"activs": ["CPU"]}, "unknown key 'activs'"),
        ({"active": 0}, "active must be an int >= 1"),
        ({"warmup": "1"}, "warmup"),
        ({"with_stack": "true"}, "with_stack must be true or false"),
        ({"is_rank": True, "rank_list": []}, "no rank profiles"),
        ({"is_rank": True, "rank_list": [-1]}, "ints >= 0"),
        ({"async_mode": True}, "async_mode"),
        ({"experimental_config": {"mstx": True, "msprof_tx": True}}, "deprecated"),
        (
            {"experimental_config": {"mstx": True, "aic_metrics": "PipeUtilization"}},
            "level1 or level2",
        ),
        ({"experimental_config": {"mstx": True, "op_attr": True}}, "op_attr"),
        (
            {
                "experimental_config": {
                    "mstx": True,
                    "mstx_domain_include": ["a"],
                    "mstx_domain_exclude": ["b"],
                }
            },
            "both",
        ),
        ({"experimental_config": {"mstx": True, "profiler_level": "Level3"}}, "Level3"),
        ({"experimental_config": {"mstx": True, "mstx_domain_include": "verl"}}, "list"),
        ({"experimental_config": {"mstx": True, "profiler_level": "level1"}}, "'level1'"),
        ({"experimental_config": {"mstx": True, "profiler_level": ["Level1"]}}, "Level1"),
        ({"is_rank": True, "rank_list": [0], "analyse": True}, "turns analysis off"),
    ],
)
def test_check_reports(change: dict[str, Any], words: str) -> None:
    data = {**TORCH_NPU_DEFAULT, "start_step": -1}
    data["experimental_config"] = {**TORCH_NPU_DEFAULT["experimental_config"], "mstx": True}
    data.update(change)
    problems = check_dynamic_profile_config(data)
    assert any(words in p for p in problems), problems


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ({"start_step": 0}, ValueError, "start_step 0"),
        ({"start_step": -2}, ValueError, "start_step"),
        ({"active": 0}, ValueError, "active"),
        ({"activities": ["GPU"]}, ValueError, "CPU, NPU"),
        ({"async_mode": True}, ValueError, "analyse"),
        ({"ranks": 3}, TypeError, "list of ints"),
        ({"ranks": []}, ValueError, "at least one"),
        ({"ranks": [0], "analyse": True}, ValueError, "async_mode=True"),
        ({"with_stack": 1}, TypeError, "with_stack"),
        ({"include": ["a"], "exclude": ["b"]}, ValueError, "both"),
        ({"level": "level0", "aic_metrics": "Memory"}, ValueError, "level1"),
    ],
)
def test_mistakes_are_errors_and_nothing_is_written(
    tmp_path: Path, args: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        dynamic_profile_config(tmp_path, **args)
    assert list(tmp_path.iterdir()) == []


def test_unreadable_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / CONFIG_NAME).write_text("{not json")
    assert "cannot read" in check_dynamic_profile_config(tmp_path)[0]


def test_torch_npu_resets_what_the_check_reports(config_context: Any) -> None:
    """The real reader does what the messages say: analysis off, lower-case level reset."""
    data = {**TORCH_NPU_DEFAULT, "start_step": -1, "analyse": True, "is_rank": True}
    data["rank_list"] = [3]  # the stub's rank
    data["experimental_config"] = {
        **TORCH_NPU_DEFAULT["experimental_config"],
        "mstx": True,
        "profiler_level": "level1",
        "aic_metrics": "PipeUtilization",
    }
    problems = check_dynamic_profile_config(data)
    assert any("turns analysis off" in p for p in problems), problems
    assert any("profiler_level 'level1'" in p for p in problems), problems
    _Utils.logs.clear()
    with capture_output() as out:
        ctx = config_context({**data, "is_valid": True})
    assert ctx.valid() is True and ctx.analyse() is False
    assert any("analyse will be closed" in message for _, message in _Utils.logs)
    assert ctx.experimental_config._profiler_level == "Level0"
    assert any("profiler_level" in line for line in out.lines)
    data["rank_list"], data["experimental_config"]["profiler_level"] = [0], "Level1"
    assert check_dynamic_profile_config({**data, "async_mode": True}) == []


def test_lower_case_activities_are_read_so_not_reported() -> None:
    data = {**TORCH_NPU_DEFAULT, "start_step": -1, "activities": ["cpu", "Npu"]}
    data["experimental_config"] = {**TORCH_NPU_DEFAULT["experimental_config"], "mstx": True}
    assert check_dynamic_profile_config(data) == []
    assert check_dynamic_profile_config({**data, "activities": [1]}) != []


def test_rewrite_never_reuses_an_earlier_seconds_value(tmp_path: Path) -> None:
    """A version the monitor has not read yet may have been pushed a second ahead: go past it."""
    target = tmp_path / CONFIG_NAME
    dynamic_profile_config(tmp_path, active=1)
    ahead = int(target.stat().st_mtime) + 5
    os.utime(target, (ahead, ahead))
    dynamic_profile_config(tmp_path, active=2)
    assert int(target.stat().st_mtime) > ahead
