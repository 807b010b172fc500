"""The phase registry: every standard name resolves, aliases agree, registration is checked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mstx_marks
from mstx_marks import mark, mstx_range
from mstx_marks.base import phases
from mstx_marks.base.phases import Phase
from mstx_marks.cli.main import main as cli_main

# REFERENCE §4, row by row, as the frameworks emit the names (typed here, not parsed at run
# time), each with the canonical phase it must resolve to.
SECTION_4: dict[str, dict[str, str]] = {
    "verl trainer step timers": {
        "step": "step",
        "gen": "generate_sequences",
        "reward": "reward",
        "old_log_prob": "compute_log_prob",
        "ref": "compute_ref_log_prob",
        "values": "compute_values",
        "adv": "adv",
        "update_critic": "update_critic",
        "update_actor": "update_actor",
        "update_weights": "update_weights",
        "save_checkpoint": "save_checkpoint",
        "testing": "testing",
        "start_profile": "start_profile",
        "stop_profile": "stop_profile",
    },
    "verl worker roles": {
        "actor_update": "update_actor",
        "actor_compute_log_prob": "compute_log_prob",
        "ref_compute_log_prob": "compute_ref_log_prob",
        "rollout_generate": "generate_sequences",
        "compute_values": "compute_values",
        "critic_update": "update_critic",
        "compute_rm_score": "compute_rm_score",
        "train_batch": "train_batch",
    },
    "verl worker methods": {
        "generate_sequences": "generate_sequences",
        "compute_log_prob": "compute_log_prob",
        "compute_ref_log_prob": "compute_ref_log_prob",
        "update_actor": "update_actor",
        "compute_values": "compute_values",
        "update_critic": "update_critic",
        "compute_rm_score": "compute_rm_score",
    },
    "verl agent loop": {
        "generate_sequences": "generate_sequences",
        "tool_calls": "tool_calls",
        "compute_score": "compute_score",
    },
    "verl sub-phases": {
        "mini_batch0": "mini_batch",
        "mini_batch7": "mini_batch",
        "micro_batch3": "micro_batch",
        "micro_batch12": "micro_batch",
    },
    "vLLM decode loop": {
        "vllm_generate_sequences": "vllm_generate_sequences",
        "vllm_one_step": "vllm_one_step",
    },
    "MindSpeed-RL stages": {
        "actor_generate": "generate_sequences",
        "actor_compute_log_prob": "compute_log_prob",
        "reference_compute_log_prob": "compute_ref_log_prob",
        "critic_compute_values": "compute_values",
        "actor_update": "update_actor",
        "critic_update": "update_critic",
    },
    "MindSpeed-RL timers": {
        "rollout": "generate_sequences",
        "old_log_p": "compute_log_prob",
        "reference_model": "compute_ref_log_prob",
        "rule_reward": "compute_score",
        "reward_model": "compute_rm_score",
        "adv": "adv",
        "update": "update_actor",
        "update_critic": "update_critic",
        "resharding_to_infer": "resharding_to_infer",
        "resharding_to_train": "resharding_to_train",
    },
}
ALL_NAMES = sorted({(n, c) for row in SECTION_4.values() for n, c in row.items()})


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registrations made by a test are forgotten after it."""
    monkeypatch.setattr(phases, "_by_name", dict(phases._by_name))
    monkeypatch.setattr(phases, "_phases", list(phases._phases))
    yield


@pytest.mark.parametrize(("name", "expected"), ALL_NAMES)
def test_every_section_4_name_resolves_to_its_canonical_phase(name: str, expected: str) -> None:
    assert phases.canonical(name) == expected
    assert phases.lookup(name).name == expected


def test_names_of_one_phase_agree_across_frameworks() -> None:
    for group in (
        ("update_actor", "actor_update", "update"),
        ("generate_sequences", "gen", "rollout_generate", "actor_generate", "rollout"),
        ("compute_log_prob", "old_log_prob", "actor_compute_log_prob", "old_log_p"),
        ("compute_ref_log_prob", "ref", "ref_compute_log_prob", "reference_compute_log_prob"),
        ("compute_values", "values", "critic_compute_values"),
        ("update_critic", "critic_update"),
        ("compute_rm_score", "reward_model"),
    ):
        assert len({phases.lookup(n) for n in group}) == 1, group


def test_different_meanings_are_different_phases() -> None:
    distinct = ["reward", "compute_rm_score", "compute_score", "train_batch", "update_critic"]
    assert len({phases.canonical(n) for n in distinct}) == len(distinct)
    assert phases.canonical("update_weights") != phases.canonical("resharding_to_infer")


def test_constants_are_the_registered_phases() -> None:
    assert phases.lookup("actor_update") is phases.UPDATE_ACTOR
    assert phases.lookup("gen") is phases.GENERATE_SEQUENCES
    assert phases.VLLM_ONE_STEP.domain == "vllm_one_step"
    assert phases.GENERATE_SEQUENCES.domain == "default"
    assert phases.all_phases()[0] is phases.STEP
    assert set(phases.__all__) >= {"GENERATE_SEQUENCES", "UPDATE_ACTOR", "VLLM_ONE_STEP"}


def test_each_name_and_alias_is_registered_once() -> None:
    texts = [t for p in phases.all_phases() for t in (p.name, *p.aliases)]
    assert len(texts) == len(set(texts))


def test_canonical_accepts_a_phase() -> None:
    assert phases.canonical(phases.UPDATE_ACTOR) == "update_actor"


@pytest.mark.parametrize(
    ("name", "close"),
    [("updte_actor", "update_actor"), ("vllm_step", "vllm_one_step"), ("zzz", "")],
)
def test_unknown_names_are_a_key_error_suggesting_close_names(name: str, close: str) -> None:
    with pytest.raises(KeyError) as info:
        phases.lookup(name)
    message = str(info.value)
    assert repr(name) in message
    assert close in message
    if not close:
        assert "python -m mstx_marks phases" in message


@pytest.mark.parametrize("name", ["micro_batchx", "step3", "3", "micro_batch-1", "micro_batch3x"])
def test_only_indexed_phases_fold_digits(name: str) -> None:
    with pytest.raises(KeyError):
        phases.canonical(name)


def test_at_builds_indexed_names_that_fold_back() -> None:
    sub = phases.MICRO_BATCH.at(12)
    assert (sub.name, sub.domain) == ("micro_batch12", "default")
    assert phases.canonical(sub) == "micro_batch"
    with pytest.raises(ValueError, match="index must be an int >= 0"):
        phases.MINI_BATCH.at(-1)
    with pytest.raises(ValueError, match="index must be an int >= 0"):
        phases.MINI_BATCH.at(True)
    with pytest.raises(ValueError, match="not indexed"):
        phases.UPDATE_ACTOR.at(0)


@given(st.integers(min_value=0, max_value=10**12))
def test_any_index_folds(i: int) -> None:
    assert phases.canonical(f"mini_batch{i}") == "mini_batch"
    assert phases.canonical(phases.MINI_BATCH.at(i)) == "mini_batch"


def test_register_a_user_phase(registry: None) -> None:
    mine = phases.register(Phase("my_eval", "my_team", framework="mine", aliases=("eval_pass",)))
    assert phases.lookup("eval_pass") is mine
    assert phases.canonical("my_eval") == "my_eval"
    assert phases.all_phases()[-1] is mine
    assert phases.register(Phase("my_eval", "my_team", framework="mine", aliases=("eval_pass",)))
    assert phases.all_phases().count(mine) == 1


@pytest.mark.parametrize(
    ("phase", "message"),
    [
        (Phase("gen"), "'gen' is already an alias of Phase('generate_sequences')"),
        (Phase("mine", aliases=("update",)), "'update' is already an alias of Phase('update_a"),
        (Phase("mine", aliases=("step",)), "'step' is the name of Phase('step')"),
        (Phase("step", "other"), "'step' is the name of Phase('step')"),
        (Phase("step", description="changed"), "already registered with other"),
    ],
)
def test_conflicting_registrations_name_both_phases(
    registry: None, phase: Phase, message: str
) -> None:
    before = phases.all_phases()
    with pytest.raises(ValueError, match="cannot register") as info:
        phases.register(phase)
    assert message in str(info.value)
    assert phases.all_phases() == before
    assert "mine" not in phases._by_name


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": ""}, ValueError),
        ({"name": "x" * 157}, ValueError),
        ({"name": 3}, TypeError),
        ({"name": "ok", "domain": "bad-domain"}, ValueError),
        ({"name": "ok", "aliases": ("",)}, ValueError),
        ({"name": "ok", "aliases": "single_str"}, TypeError),
        ({"name": "ok", "indexed": 1}, TypeError),
    ],
)
def test_phases_are_validated_like_names_and_domains(
    kwargs: dict[str, object], error: type
) -> None:
    with pytest.raises(error):
        Phase(**kwargs)  # type: ignore[arg-type]


def test_register_refuses_non_phases() -> None:
    with pytest.raises(TypeError, match="takes a Phase"):
        phases.register("update_actor")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="str or a Phase"):
        phases.lookup(3)  # type: ignore[arg-type]


def test_phases_mark_ranges_with_their_name_and_domain(recorder: mstx_marks.Recorder) -> None:
    @mstx_range(phases.UPDATE_ACTOR)
    def update() -> int:
        return 1

    with mark(phases.VLLM_ONE_STEP):
        assert update() == 1
    got = sorted((r.name, r.domain) for r in recorder.records())
    assert got == [("update_actor", "default"), ("vllm_one_step", "vllm_one_step")]


def test_table_lists_every_phase_with_domain_framework_and_aliases() -> None:
    lines = phases.phases_table().splitlines()
    assert lines[0].split() == ["name", "domain", "emitted", "framework", "aliases"]
    assert len(lines) == 1 + len(phases.all_phases())
    row = next(line for line in lines if line.startswith("vllm_one_step "))
    assert row.split()[:4] == ["vllm_one_step", "vllm_one_step", "preset", "vLLM"]
    actor = next(line for line in lines if line.startswith("update_actor "))
    assert actor.endswith("actor_update, ActorHybridWorkerBase.update, update")
    micro = next(line for line in lines if line.startswith("micro_batch{i} "))
    assert micro.split()[2] == "record_function"  # verl's sub-phases are not MSTX ranges
    assert any(line.startswith("micro_batch{i} ") for line in lines)


def test_cli_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["phases"]) == 0
    assert capsys.readouterr().out.strip() == phases.phases_table()
    assert cli_main(["phases", "--bogus"]) == 2  # argparse's exit ends in cli.main, not here
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_indexed_phases_are_memoized_so_mark_caches_one_site_each() -> None:
    from mstx_marks import mark
    from mstx_marks.core import ranges

    assert phases.MICRO_BATCH.at(3) is phases.MICRO_BATCH.at(3)
    before = len(ranges._cached.get(None, {}))
    for _ in range(100):
        for i in range(4):
            mark(phases.MICRO_BATCH.at(i))
    assert len(ranges._cached.get(None, {})) - before <= 4  # one entry per index, not per call


#: Every function Ascend/MindSpeed-RL @ 05a90d77 decorates with its ``mstx_timer_decorator``
#: (47; read with an AST walk of ``mindspeed_rl/``), as the ``__qualname__`` its range carries.
MINDSPEED_RL_TIMED = (
    "Actor.compute_image_embeds", "Actor.compute_log_prob", "Actor.update_actor",
    "ActorRolloutHybrid.compute_image_embeds", "ActorRolloutHybrid.generate_sequences",
    "ActorRolloutHybrid.compute_log_prob", "ActorRolloutHybrid.update_actor",
    "Critic.compute_values", "Critic.update_critic", "Reference.compute_log_prob",
    "Reward.compute_rm_score", "compute_verifier_score", "compute_advantage",
    "padding_dict_to_tensor_dict", "remove_padding_tensor_dict_to_dict",
    "remove_padding_and_split_to_list", "ActorHybridWorkerBase.update",
    "ActorHybridWorkerBase.generate_sequences", "ActorHybridWorkerBase.compute_log_prob",
    "ActorHybridWorkerBase.compute_image_embeds", "BaseWorker.all_consumed",
    "BaseWorker.empty_cache", "BaseWorker.dispatch_transfer_dock_data",
    "BaseWorker.collect_transfer_dock_data", "BaseWorker.collect_transfer_dock_mm_data",
    "CriticWorkerBase.compute_values", "CriticWorkerBase.update",
    "IntegratedWorker.compute_ref_log_prob", "ReferenceWorkerBase.compute_ref_log_prob",
    "MegatronOffLoader.offload_grad", "MegatronOffLoader.onload_grad",
    "MegatronOffLoader.offload_optimizer", "MegatronOffLoader.onload_optimizer",
    "MegatronOffLoader._move_to_device", "MegatronOffLoader.offload_param",
    "MegatronOffLoader.onload_param", "MegatronOffLoader.swap_tensors_to_host",
    "MegatronOffLoader.swap_tensors_to_device", "MegatronShardingManager.offload_infer_params",
    "MegatronShardingManager.onload_infer_params", "MegatronShardingManager.enter_infer_mode",
    "MegatronShardingManager.exit_infer_mode", "MegatronShardingManager.enter_forward_mode",
    "MegatronShardingManager.exit_forward_mode", "MegatronShardingManager.enter_train_mode",
    "MegatronShardingManager.exit_train_mode", "VitWorkerBase.compute_image_embeds",
)  # fmt: skip


def test_every_stage_mindspeed_rl_times_is_a_known_phase() -> None:
    assert len(set(MINDSPEED_RL_TIMED)) == 47
    unknown = []
    for qualname in MINDSPEED_RL_TIMED:
        try:
            phases.canonical(qualname)
        except KeyError:
            unknown.append(qualname)
    assert unknown == []
    # The roles stay apart: a reference's log-prob is no actor's, a forward-mode switch no
    # inference reshard.
    assert phases.canonical("Reference.compute_log_prob") == "compute_ref_log_prob"
    assert phases.canonical("MegatronShardingManager.enter_forward_mode") == "resharding_to_forward"
    assert phases.canonical("remove_padding_and_split_to_list") == "unpad_experience"
