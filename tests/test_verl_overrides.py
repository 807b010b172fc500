"""verl_overrides / check_verl_overrides, checked against verl 0.9.1's own configuration classes.

verl's package ``__init__`` imports torch and ray, so only its config files are loaded, by path,
under stub packages; Hydra composes ``ppo_trainer`` (strict: a misspelled key fails) and verl's
``omega_conf_to_dataclass`` instantiates every role's profiler config and runs its validation.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from mstx_marks.cli.main import main as cli_main
from mstx_marks.profiling.verl_config import (
    ROLES,
    check_verl_overrides,
    verl_overrides,
)


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        msg = f"{module} is not installed (pip install --no-deps verl==0.9.1 hydra-core omegaconf)"
        if os.environ.get("CI") == "true" and sys.version_info >= (3, 10):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


@contextlib.contextmanager
def _verl_config_modules() -> Iterator[types.ModuleType]:
    """verl's config modules loaded by path under stub packages; sys.modules restored after."""
    if sys.version_info < (3, 10):
        pytest.skip("verl 0.9.1 needs Python >= 3.10")
    for module in ("verl", "hydra", "omegaconf"):
        _need(module)
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    saved = {k: v for k, v in sys.modules.items() if k == "verl" or k.startswith("verl.")}
    for k in saved:
        del sys.modules[k]
    try:
        for name in ("verl", "verl.utils", "verl.utils.profiler"):
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = package
        loaded = {}
        for name in ("verl.base_config", "verl.utils.config", "verl.utils.profiler.config"):
            path = root.joinpath(*name.split(".")[1:]).with_suffix(".py")
            file_spec = importlib.util.spec_from_file_location(name, path)
            assert file_spec is not None and file_spec.loader is not None
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[name] = module
            file_spec.loader.exec_module(module)
            loaded[name] = module
        profiler_pkg = sys.modules["verl.utils.profiler"]
        profiler_config = loaded["verl.utils.profiler.config"]
        profiler_pkg.ProfilerConfig = profiler_config.ProfilerConfig  # type: ignore[attr-defined]
        profiler_pkg.config = profiler_config  # type: ignore[attr-defined]
        env = types.SimpleNamespace(
            root=root,
            to_dataclass=loaded["verl.utils.config"].omega_conf_to_dataclass,
            NPUToolConfig=profiler_config.NPUToolConfig,
        )
        yield env  # type: ignore[misc]
    finally:
        for k in [k for k in sys.modules if k == "verl" or k.startswith("verl.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def verl() -> Iterator[Any]:
    with _verl_config_modules() as env:
        yield env


def compose(verl: Any, overrides: list[str]) -> tuple[Any, dict[str, Any]]:
    """Compose ppo_trainer with ``overrides`` and build every role's ProfilerConfig as verl does."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(verl.root / "trainer" / "config"), version_base=None):
        cfg = hydra_compose(config_name="ppo_trainer", overrides=overrides)
    roles = {role: verl.to_dataclass(OmegaConf.select(cfg, p)) for role, p in ROLES.items()}
    return cfg, roles


ROLE_SETS = st.lists(st.sampled_from(list(ROLES)), min_size=1, max_size=4, unique=True)


@st.composite
def valid_args(draw: st.DrawFn) -> dict[str, Any]:
    roles = draw(ROLE_SETS)
    args: dict[str, Any] = {
        "steps": draw(st.lists(st.integers(1, 500), min_size=1, max_size=4)),
        "save_path": draw(st.sampled_from(["outputs/profile", "/tmp/a b/prof", "/x:y,z/p@1"])),
        "roles": roles,
        "level": draw(st.sampled_from([None, "level_none", "level0", "level1", "level2"])),
        # From verl 0.9.1 only a list with "npu" collects MSTX: verl_overrides insists on it.
        "contents": draw(
            st.none()
            | st.lists(
                st.sampled_from(["cpu", "memory", "shapes", "module", "stack"]), unique=True
            ).map(lambda rest: ["npu", *rest])
        ),
        "analysis": draw(st.sampled_from([None, True, False])),
    }
    if draw(st.booleans()):
        args["all_ranks"] = True
    else:
        args["ranks"] = draw(st.none() | st.lists(st.integers(0, 64), min_size=1, max_size=3))
    if "rollout" in roles:
        if draw(st.booleans()):
            start = draw(st.integers(0, 100))
            args["token_window"] = (start, start + draw(st.integers(1, 100)))
        args["engine"] = draw(st.sampled_from([None, "vllm"]))
        if roles == ["rollout"] and args["engine"] == "vllm":
            args["level"] = args["analysis"] = None  # an error: see test_mistakes_are_errors
    else:
        args["discrete"] = draw(st.sampled_from([None, True, False]))
    return args


# Each example composes verl's whole trainer config (about 0.3 s).
@settings(
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)
@given(valid_args())
def test_every_override_is_accepted_by_verl_and_means_what_was_asked(
    verl: Any, args: dict[str, Any]
) -> None:
    lines = verl_overrides(**args)
    cfg, roles = compose(verl, lines)
    assert list(cfg.global_profiler.steps) == sorted(set(args["steps"]), key=args["steps"].index)
    assert cfg.global_profiler.tool == "npu"
    assert cfg.global_profiler.save_path == args["save_path"]
    asked = set(args["roles"])
    for role, prof in roles.items():
        npu = prof.tool_config["npu"]
        assert isinstance(npu, verl.NPUToolConfig)
        assert prof.save_path == args["save_path"]
        assert prof.enable is (role in asked), role  # actor alone does not drag rollout in
        if role not in asked:
            continue
        assert prof.tool == "npu"
        if args.get("all_ranks"):
            assert prof.all_ranks is True
        else:
            assert prof.ranks == (
                sorted(set(args["ranks"]), key=args["ranks"].index) if args["ranks"] else []
            )
        assert npu.contents == (args["contents"] or ["npu", "cpu"])
        vllm_rollout = role == "rollout" and args.get("engine") == "vllm"
        if args["level"] is not None and not vllm_rollout:
            assert npu.level == args["level"]
        if args["analysis"] is not None and not vllm_rollout:
            assert npu.analysis is args["analysis"]
        if "rollout" in asked:
            assert npu.discrete is True
        elif args.get("discrete") is not None:
            assert npu.discrete is args["discrete"]
        if role == "rollout" and "token_window" in args:
            assert (npu.profile_token_start, npu.profile_token_end) == args["token_window"]
    assert check_verl_overrides([*lines, "actor_rollout_ref.actor.use_kl_loss=True"]) == [], lines


def test_verl_itself_lets_these_through_silently(verl: Any) -> None:
    """The traps exist: verl accepts each of these without a word."""
    _, roles = compose(verl, ["actor_rollout_ref.actor.profiler.tool_config.npu.discrete=no"])
    assert roles["actor"].tool_config["npu"].discrete == "no"  # a truthy string: discrete mode on
    cfg, roles = compose(
        verl,
        [
            "global_profiler.tool=nps",
            "global_profiler.steps=null",
            "actor_rollout_ref.actor.profiler.enable=True",
        ],
    )
    assert roles["rollout"].enable is True  # inherited from the actor
    assert roles["actor"].tool == "nps" and cfg.global_profiler.steps is None


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ({"steps": 5}, TypeError, "list of ints"),
        ({"steps": []}, ValueError, "at least one"),
        ({"steps": [0]}, ValueError, ">= 1"),
        ({"steps": [True]}, TypeError, "int"),
        ({"steps": [1], "roles": ["rollout"], "discrete": False}, ValueError, "discrete=True"),
        ({"steps": [1], "roles": ["actor"], "token_window": (0, 5)}, ValueError, "rollout role"),
        ({"steps": [1], "roles": ["rollout"], "token_window": (5, 5)}, ValueError, "stop > start"),
        ({"steps": [1], "roles": ["rollout"], "token_window": (-1, 5)}, ValueError, ">= 0"),
        (
            {"steps": [1], "roles": ["rollout"], "engine": "vllm", "level": "level1"},
            ValueError,
            "vLLM",
        ),
        ({"steps": [1], "engine": "sglang", "contents": ["npu", "memory"]}, ValueError, "SGLang"),
        ({"steps": [1], "contents": ["cpu"]}, ValueError, "no MSTX range is collected"),
        ({"steps": [1], "tool": "nps"}, ValueError, "silently disables"),
        ({"steps": [1], "tool": "torch"}, ValueError, "tool_config.npu"),
        ({"steps": [1], "discrete": "yes"}, TypeError, "True or False"),
        ({"steps": [1], "analysis": 1}, TypeError, "True or False"),
        ({"steps": [1], "ranks": 0}, TypeError, "list of ints"),
        ({"steps": [1], "ranks": [0], "all_ranks": True}, ValueError, "conflict"),
        ({"steps": [1], "level": "Level1"}, ValueError, "level_none"),
        ({"steps": [1], "contents": ["cuda"]}, ValueError, "cuda"),
        ({"steps": [1], "uses_reference": False}, ValueError, "reference policy"),
        ({"steps": [1], "roles": ["critic"], "uses_critic": False}, ValueError, "critic"),
        ({"steps": [1], "continuous": True}, ValueError, "discrete=False"),
        ({"steps": [1], "save_path": "/it's"}, ValueError, "quote"),
    ],
)
def test_mistakes_are_errors(args: dict[str, Any], error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        verl_overrides(**args)


SCRIPT = """\
#!/bin/bash
set -x
STEPS=[1,2]
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    actor_rollout_ref.rollout.name=vllm \\
    global_profiler.tool=npu \\
    global_profiler.steps=$STEPS \\
    actor_rollout_ref.actor.profiler.enable=True \\
    actor_rollout_ref.actor.profiler.ranks=0 \\
    actor_rollout_ref.actor.profiler.tool_config.npu.discrete=yes \\
    actor_rollout_ref.actor.profiler.tool_config.npu.profile_token_start=3 \\
    actor_rollout_ref.rollout.profiler.tool_config.npu.level=level1 \\
    'actor_rollout_ref.ref.profiler.enable=True' \\
    critic.profiler.enable=True \\
    critic.profiler.tool_config.npu.levle=level1  # a typo
"""


def test_check_reports_each_problem_with_its_line() -> None:
    got = {(p.line, p.message.split(" ")[0]) for p in check_verl_overrides(SCRIPT)}
    assert (10, "ranks") in got
    assert (11, "must") in got  # discrete=yes
    assert (12, "profile_token_start") in got  # not under the actor
    assert (13, "vLLM") in got
    assert (14, "ref") in got  # no KL: ref never runs
    assert (15, "no") in got  # grpo without critic.enable
    assert (16, "unknown") in got
    # Rollout takes the actor's enable and its discrete=yes, which verl reads as true: it is
    # profiled, and the line that sets the bad discrete is named.
    assert (11, "rollout") in got
    assert (9, "rollout:") in got  # its contents: verl's default, asked for by line 9
    assert not any(line == 8 for line, _ in got)  # shell variable: not checked
    messages = [str(p) for p in check_verl_overrides(SCRIPT)]
    assert messages == sorted(messages, key=lambda m: int(m.split(":")[0].split()[1]))


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["global_profiler.steps=null"], "disables"),
        (["global_profiler.steps=3"], "bare int"),
        (["global_profiler.steps=[0,1]"], ">= 1"),
        (["global_profiler.tool=nps"], "silently"),
        (
            [
                "global_profiler.tool=torch",
                "critic.profiler.enable=True",
                "critic.profiler.tool_config.npu.level=level1",
            ],
            "ignored",
        ),
        (["critic.profiler.enable=True"], "tool is not set"),
        (["global_profiler.tool=npu", "critic.profiler.enable=True"], "steps is not set"),
        (
            [
                "actor_rollout_ref.rollout.profiler.tool_config.npu.profile_token_start=5",
                "actor_rollout_ref.rollout.profiler.tool_config.npu.profile_token_end=5",
                "actor_rollout_ref.rollout.profiler.enable=True",
            ],
            "must be > profile_token_start",
        ),
        (
            [
                "actor_rollout_ref.rollout.name=sglang",
                "actor_rollout_ref.actor.profiler.enable=True",
                "actor_rollout_ref.actor.profiler.tool_config.npu.discrete=True",
                "actor_rollout_ref.actor.profiler.tool_config.npu.contents=[memory]",
            ],
            "SGLang",
        ),
        (
            [
                "global_profiler.profile_continuous_steps=True",
                "critic.profiler.enable=True",
                "critic.profiler.tool_config.npu.discrete=True",
            ],
            "continuous",
        ),
        (["critic.profiler.tool_config.npu.contents=[gpu]"], "contents"),
        (
            [
                "global_profiler.tool=npu",
                "global_profiler.steps=[1]",
                "critic.profiler.enable=True",
                "critic.profiler.tool_config.npu.contents=[cpu]",
            ],
            "no MSTX range is collected",
        ),
        (  # no contents override: verl 0.9.1's default [] collects no MSTX either
            [
                "global_profiler.tool=npu",
                "global_profiler.steps=[1]",
                "critic.profiler.enable=True",
            ],
            "add critic.profiler.tool_config.npu.contents=[npu,cpu]",
        ),
        (["critic.profiler.tool_config.npu.level=3"], "level"),
        (["global_profiler.stepz=[1]"], "unknown"),
    ],
)
def test_check_catches(overrides: list[str], words: str) -> None:
    assert any(words in p.message for p in check_verl_overrides(overrides)), check_verl_overrides(
        overrides
    )


def test_cli_prints_shell_ready_overrides(capsys: pytest.CaptureFixture[str], verl: Any) -> None:
    code = cli_main(
        [
            "verl-overrides",
            "--steps",
            "1,2,5",
            "--ranks",
            "0",
            "--level",
            "level1",
            "--roles",
            "actor,rollout",
            "--save-path",
            "/tmp/p q",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert "'global_profiler.steps=[1,2,5]'" in out
    import shlex

    lines = [shlex.split(line)[0] for line in out]
    cfg, roles = compose(verl, lines)
    assert cfg.global_profiler.save_path == "/tmp/p q" and roles["rollout"].ranks == [0]
    assert cli_main(["verl-overrides", "--steps", "1", "--raw"]) == 0
    assert "global_profiler.steps=[1]" in capsys.readouterr().out.splitlines()


def test_cli_bad_input_names_value_and_rule(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["verl-overrides", "--steps", "0"]) == 2
    assert "steps entry must be >= 1, got 0" in capsys.readouterr().err
    assert cli_main(["verl-overrides", "--steps", "x"]) == 2
    assert "'x' must be comma-separated ints" in capsys.readouterr().err
    assert cli_main(["verl-overrides", "--steps", "1", "--roles", "rollout", "--no-discrete"]) == 2
    assert "discrete=True" in capsys.readouterr().err


def test_check_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "run.sh"
    script.write_text(SCRIPT)
    assert cli_main(["check-verl", str(script)]) == 1
    out = capsys.readouterr().out
    assert f"{script}:line 13: " in out
    good = verl_overrides(steps=[1], roles=["actor"])
    assert cli_main(["check-verl", *good]) == 0
    assert cli_main(["check-verl", str(tmp_path / "missing.sh")]) == 2


SHELL_SCRIPT = """\
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=$ADV \\
    global_profiler.tool=$TOOL \\
    global_profiler.steps="$STEPS" \\
    actor_rollout_ref.actor.use_kl_loss=${KL} \\
    actor_rollout_ref.actor.profiler.enable=True \\
    actor_rollout_ref.actor.profiler.tool_config.npu.discrete=$DISCRETE \\
    actor_rollout_ref.actor.profiler.tool_config.npu.level=level1 \\
    actor_rollout_ref.ref.profiler.enable=True \\
    critic.profiler.enable=True
"""


def test_values_from_shell_variables_are_set_but_unknown() -> None:
    """A ``$VAR`` value is neither checked nor taken as "not set" by the rules that span keys."""
    assert check_verl_overrides(SHELL_SCRIPT) == []
    literal = SHELL_SCRIPT.replace("$TOOL", "torch")
    assert [p.line for p in check_verl_overrides(literal)] == [7]  # npu.* ignored under torch


@pytest.mark.parametrize(
    ("override", "flagged"),
    [
        ("+actor_rollout_ref.actor.profiler.enable=True", True),
        ("+critic.profiler.tool_config.npu.discrete=True", True),
        ("+global_profiler.save_path=/p", True),
        ("+global_profiler.steps=[1]", False),  # null in verl: Hydra lets '+' add it
        ("+actor_rollout_ref.rollout.profiler.tool_config.npu.profile_token_end=4", False),
        ("++actor_rollout_ref.actor.profiler.enable=True", False),
        ("+actor_rollout_ref.actor.use_kl_loss=True", False),  # not a key the checks know
    ],
)
def test_plus_on_a_key_verl_already_sets_is_reported_as_hydra_fails(
    verl: Any, override: str, flagged: bool
) -> None:
    found = any("'+' adds a new key" in p.message for p in check_verl_overrides([override]))
    assert found is flagged
    if override.startswith("+actor_rollout_ref.actor.use_kl_loss"):
        return
    if flagged:
        with pytest.raises(Exception, match="Could not append to config"):
            compose(verl, [override])
    else:
        compose(verl, [override])


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["critic.profiler.tool=nps"], "silently disables"),
        (["global_profiler.steps=[01]"], "ints >= 1"),  # Hydra keeps '01' as a string
        (["critic.profiler.enable=1"], "keeps 1 as a number"),
    ],
)
def test_check_catches_role_tool_and_hydra_value_types(overrides: list[str], words: str) -> None:
    problems = check_verl_overrides(overrides)
    assert any(words in p.message for p in problems), problems


def test_hydra_deletion_and_underscored_ints_are_not_misreported(verl: Any) -> None:
    good = ["~critic.profiler.tool_config", "global_profiler.steps=[1_0]"]
    assert check_verl_overrides(good) == []
    cfg, _ = compose(verl, ["global_profiler.steps=[1_0,01]"])
    assert list(cfg.global_profiler.steps) == [10, "01"]
    assert cli_main(["check-verl", "~critic.profiler.tool_config", "global_profiler.tool=npu"]) == 0


@pytest.mark.parametrize("save_path", ["2024", "1e3", "true", "null", "07"])
def test_a_save_path_hydra_would_type_stays_a_string(verl: Any, save_path: str) -> None:
    cfg, roles = compose(verl, verl_overrides(steps=[1], save_path=save_path, roles=["critic"]))
    assert cfg.global_profiler.save_path == save_path
    assert roles["critic"].save_path == save_path


def test_token_window_that_is_not_a_pair_names_the_rule() -> None:
    with pytest.raises(TypeError, match=r"token_window 5 must be \(start, stop\)"):
        verl_overrides(steps=[1], roles=["rollout"], token_window=5)  # type: ignore[arg-type]


def test_check_verl_refuses_a_reversed_or_empty_token_window_even_when_off() -> None:
    from mstx_marks.profiling.verl_config import check_verl_overrides

    key = "actor_rollout_ref.rollout.profiler.tool_config.npu.profile_token_"
    for start, end in ((46, 12), (5, 5)):
        problems = check_verl_overrides([f"{key}start={start}", f"{key}end={end}"])
        assert len(problems) == 1 and "must be > profile_token_start" in str(problems[0])
    assert check_verl_overrides([f"{key}start=0", f"{key}end=64"]) == []


def test_sglang_rollout_ignores_level_and_analysis_loudly() -> None:
    import pytest as _pytest

    from mstx_marks.profiling.verl_config import check_verl_overrides, verl_overrides

    with _pytest.raises(ValueError, match=r"SGLang .* ignores level and analysis"):
        verl_overrides(steps=[1], roles=["rollout"], engine="sglang", level="level1")
    lines = [
        "global_profiler.tool=npu",
        "global_profiler.steps=[1]",
        "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.profiler.enable=True",
        "actor_rollout_ref.rollout.profiler.tool_config.npu.discrete=True",
        "actor_rollout_ref.rollout.profiler.tool_config.npu.contents=[npu,cpu]",
        "actor_rollout_ref.rollout.profiler.tool_config.npu.analysis=False",
    ]
    problems = [str(p) for p in check_verl_overrides(lines)]
    assert len(problems) == 1 and "SGLang" in problems[0] and "ignores analysis" in problems[0]


def test_rollout_ranks_are_documented_as_replica_ranks() -> None:
    from mstx_marks.profiling.verl_config import verl_overrides

    assert "replica ranks" in (verl_overrides.__doc__ or "")


def test_check_verl_reads_the_values_given_to_rays_workers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env_vars = "+ray_kwargs.ray_init.runtime_env.env_vars."
    hook = "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook="
    good = [f"{env_vars}MSTX_MARKS_INSTRUMENT='verl,vllm'", f"{hook}mstx_marks.activate"]
    assert cli_main(["check-verl", *good]) == 0
    capsys.readouterr()
    bad = [
        f"{env_vars}MSTX_MARKS_INSTRUMENT='vlm'",  # the run would ignore it
        f"{hook}mstx_marks.activate:activate",  # Ray refuses module:function
        f"{env_vars}MSTX_MARKS_OTU=prof",  # a mistyped variable
        f"{hook}mstx_marks.activat",  # no such hook
    ]
    assert cli_main(["check-verl", *bad]) == 1
    out = capsys.readouterr().out
    said = ("'vlm'", "module:function", "not an mstx_marks variable", "no hook")
    for line, words in enumerate(said, 1):
        assert any(s.startswith(f"line {line}:") and words in s for s in out.splitlines()), out


# --- issue 37: the guide's own script ----------------------------------------------------------

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "verl-ascend.md"


def _guide_script() -> str:
    """The ``run_grpo.sh`` block of the verl guide, as a reader copies it."""
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index('```bash title="run_grpo.sh"\n') + len('```bash title="run_grpo.sh"\n')
    return text[start : text.index("```", start)]


def test_check_verl_on_the_guides_script_names_each_findings_own_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, verl: Any
) -> None:
    script = _guide_script()
    (tmp_path / "run_grpo.sh").write_text(script)
    monkeypatch.chdir(tmp_path)
    assert cli_main(["check-verl", "run_grpo.sh"]) == 1
    said = capsys.readouterr().out.splitlines()
    lines = script.splitlines()
    assert said, "the guide's script has problems the guide shows"
    for finding in said:
        number = int(finding.split(":line ")[1].split(":")[0])
        assert 1 <= number <= len(lines), finding  # a line of the script, never "line 0"
        text = finding.split(":", 3)[2].strip()
        assert text in lines[number - 1], finding  # the override quoted is on that line
        if "actor_rollout_ref.actor.profiler.enable=True" in finding:
            # The enable line is named only for what a default fills in, which it says.
            assert "verl's default" in finding, finding
    # Only the actor is profiled: verl gives rollout the actor's enable, but its servers
    # drive the engine's profiler in discrete mode only, and the script is not discrete.
    _, roles = compose(verl, [ln.strip(" \\") for ln in lines[1:] if "=" in ln])
    assert roles["rollout"].enable is True and roles["rollout"].tool_config["npu"].discrete is False
    about_rollout = [f for f in said if "rollout" in f.replace("actor_rollout_ref", "")]
    assert not about_rollout, about_rollout
    # What the guide shows of the output is what the command prints.
    shown = GUIDE.read_text(encoding="utf-8").split("$ mstx-marks check-verl run_grpo.sh")[1]
    for line in shown.split("```")[0].splitlines():
        if line.startswith("run_grpo.sh:"):
            assert line in said, line


_NPU = "tool_config.npu"
_POOL = [
    *(f"{ROLES[r]}.enable={v}" for r in ROLES for v in ("True", "False")),
    *(f"{ROLES[r]}.{_NPU}.discrete={v}" for r in ROLES for v in ("True", "False", "yes")),
    *(f"{ROLES[r]}.{_NPU}.contents={v}" for r in ROLES for v in ("[npu,cpu]", "[cpu]", "[memory]")),
    "actor_rollout_ref.rollout.profiler.tool_config.npu.profile_token_start=5",
    "actor_rollout_ref.rollout.profiler.tool_config.npu.profile_token_end=3",
    "actor_rollout_ref.rollout.profiler.tool_config.npu.level=level1",
    "actor_rollout_ref.rollout.name=sglang",
    "actor_rollout_ref.rollout.name=vllm",
    "global_profiler.tool=npu",
    "global_profiler.tool=torch",
    "global_profiler.steps=[1]",
    "global_profiler.profile_continuous_steps=True",
    "algorithm.adv_estimator=grpo",
    "critic.enable=False",
]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(overrides=st.lists(st.sampled_from(_POOL), max_size=10))
def test_every_finding_names_an_override_that_is_there(overrides: list[str]) -> None:
    """Whatever the mix, each finding names a line of the input and quotes what is on it:
    none is "line 0: (not set)"; one that a default causes says which default."""
    for problem in check_verl_overrides(overrides):
        assert 1 <= problem.line <= len(overrides), problem
        assert problem.text == overrides[problem.line - 1], problem
