"""The registry of standard RL phase names, and the :class:`Phase` value that names a range.

The same phase goes by different names across frameworks and versions: verl's worker method
``update_actor`` is the role ``actor_update`` in verl 0.9 and in MindSpeed-RL, and the timer
``update`` in MindSpeed-RL's trainer. The registry maps every such alias to one canonical phase,
so traces from any of them can be compared and summed.

**Canonical names.** Where a verl worker method does the work (``generate_sequences``,
``compute_log_prob``, ``compute_ref_log_prob``, ``update_actor``, ``compute_values``,
``update_critic``, ``compute_rm_score``), the method name is canonical: it is what verl emitted
until 2026, what existing traces and dashboards contain, and the attribute that
:mod:`mstx_marks.capture.instrument` patches. Other phases keep the one name their framework emits.
Each meaning is one phase: the trainer timer ``gen`` and the role ``rollout_generate`` are both
``generate_sequences``; the stage ``reward`` (the whole reward computation), a reward model's
``compute_rm_score`` and a reward function's ``compute_score`` are three phases.

>>> canonical("actor_update") == canonical("update_actor") == "update_actor"
True
>>> canonical("micro_batch3")
'micro_batch'
>>> lookup("vllm_one_step").domain
'vllm_one_step'
>>> from mstx_marks import configure, mark
>>> configure(backend="record")
>>> with mark(GENERATE_SEQUENCES):
...     pass
>>> lookup("updte_actor")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
mstx_marks.base.phases.UnknownPhase: 'updte_actor' is not a registered phase or alias; close: ...
"""

from __future__ import annotations

import re

from mstx_marks.base.forking import new_lock
from mstx_marks.base.names import DEFAULT_DOMAIN, check_domain, check_name

__all__ = [
    "ACTOR_SEND_WEIGHTS",
    "ADV",
    "COMPUTE_LOG_PROB",
    "COMPUTE_REF_LOG_PROB",
    "COMPUTE_RM_SCORE",
    "COMPUTE_SCORE",
    "COMPUTE_VALUES",
    "DATALOADER",
    "DECODE_BATCH",
    "DRAFT_EXTEND_BATCH",
    "DUMP_ROLLOUT",
    "EMITTED",
    "FORWARD_BACKWARD",
    "GENERATE_ASYNC",
    "GENERATE_SEQUENCES",
    "INFER_BATCH",
    "MEASURED_ELSEWHERE",
    "MICRO_BATCH",
    "MINI_BATCH",
    "MIXED_BATCH",
    "OFFLOAD",
    "ONLOAD",
    "PREFILL_BATCH",
    "RESHARDING_TO_INFER",
    "RESHARDING_TO_TRAIN",
    "REWARD",
    "ROLLOUT_PAUSE",
    "ROLLOUT_RECEIVE_WEIGHTS",
    "ROLLOUT_RESUME",
    "SAMPLING",
    "SAVE_CHECKPOINT",
    "SGLANG_FORWARD",
    "START_PROFILE",
    "STEP",
    "STOP_PROFILE",
    "SWITCH_TO_ROLLOUT",
    "SWITCH_TO_TRAINER",
    "SWITCH_WAIT",
    "TESTING",
    "TOOL_CALLS",
    "TRAIN_BATCH",
    "TRAIN_MINI_BATCH",
    "TRANSFER_DOCK_COLLECT",
    "TRANSFER_DOCK_DISPATCH",
    "UPDATE_ACTOR",
    "UPDATE_CRITIC",
    "UPDATE_WEIGHTS",
    "VERIFY_BATCH",
    "VLLM_GENERATE_SEQUENCES",
    "VLLM_ONE_STEP",
    "WAIT_FOR_ENOUGH_SAMPLES",
    "Phase",
    "UnknownPhase",
    "all_phases",
    "canonical",
    "lookup",
    "phases_table",
    "register",
]


class Phase:
    """A named phase: usable wherever a range name is, as ``mark(PHASE)`` or ``@mstx_range(PHASE)``.

    Name, domain and aliases are checked once, here, so using a phase costs no more than a
    literal name. An ``indexed`` phase is emitted with a number appended (verl's
    ``micro_batch{i}``): :meth:`at` builds those names and the registry folds them back.
    Phases compare and hash by identity, like other registry objects: :func:`lookup` returns
    the one registered object, and ``mark(PHASE)`` finds its cached range with a C-level hash.

    >>> p = Phase("generate_sequences", framework="verl", description="rollout generation")
    >>> p.name, p.domain
    ('generate_sequences', 'default')
    >>> Phase("micro_batch", indexed=True).at(3)
    Phase('micro_batch3')
    """

    __slots__ = (
        "_at",
        "aliases",
        "description",
        "domain",
        "emitted",
        "framework",
        "indexed",
        "name",
    )

    name: str
    domain: str
    framework: str
    description: str
    aliases: tuple[str, ...]
    indexed: bool
    emitted: str

    def __init__(
        self,
        name: str,
        domain: str | None = None,
        *,
        framework: str = "",
        description: str = "",
        aliases: tuple[str, ...] = (),
        indexed: bool = False,
        emitted: str = "range",
    ) -> None:
        self.name = check_name(name, "phase name")
        self.domain = DEFAULT_DOMAIN if domain is None else check_domain(domain)
        self.framework = framework
        self.description = description
        if isinstance(aliases, str):
            raise TypeError(f"aliases must be a tuple of str, got the str {aliases!r}")
        # An alias equal to the name adds nothing; dropping it keeps the table and lookups clean.
        self.aliases = tuple(
            dict.fromkeys(a for a in (check_name(a, "phase alias") for a in aliases) if a != name)
        )
        if not isinstance(indexed, bool):
            raise TypeError(f"indexed must be a bool, got {indexed!r}")
        self.indexed = indexed
        if emitted not in EMITTED:
            raise ValueError(f"emitted {emitted!r} must be one of {', '.join(EMITTED)}")
        self.emitted = emitted
        self._at: dict[int, Phase] = {}

    def at(self, index: int) -> Phase:
        """The phase for one index of an indexed phase: ``MICRO_BATCH.at(3)`` is ``micro_batch3``.

        >>> Phase("step").at(1)
        Traceback (most recent call last):
        ...
        ValueError: Phase('step') is not indexed; only indexed phases take .at(index)
        """
        if not self.indexed:
            raise ValueError(f"{self!r} is not indexed; only indexed phases take .at(index)")
        found = self._at.get(index) if type(index) is int else None
        if found is not None:
            return found
        if type(index) is not int or index < 0:
            raise ValueError(f"{self.name}.at(index): index must be an int >= 0, got {index!r}")
        # One object per index: phases hash by identity, so mark(P.at(i)) in a loop must find
        # the same cached range every time rather than add one per call.
        found = Phase(
            f"{self.name}{index}",
            self.domain,
            framework=self.framework,
            description=self.description,
        )
        if len(self._at) < _MAX_INDEXED:
            self._at[index] = found
        return found

    def __repr__(self) -> str:
        dom = "" if self.domain == DEFAULT_DOMAIN else f", domain={self.domain!r}"
        return f"Phase({self.name!r}{dom})"

    def _fields(self) -> tuple[object, ...]:
        return (
            self.name,
            self.domain,
            self.framework,
            self.description,
            self.aliases,
            self.indexed,
            self.emitted,
        )


#: How a phase reaches a trace: a profiler range (MSTX/NVTX), a ``torch.profiler``
#: ``record_function`` (a CPU op in torch_npu's capture, not MSTX), a metric or timing key only,
#: or a range only our presets emit (the frameworks have none of their own).
EMITTED = ("range", "record_function", "metric", "preset")


class UnknownPhase(KeyError):
    """A name that is neither a registered phase nor an alias; its message lists close names.

    The suggestions are computed only when the message is read, so code that folds many
    arbitrary range names (``try: canonical(n) except KeyError``) does not pay for them.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        import difflib  # only when the message is read: keeps it out of `import mstx_marks`

        close = difflib.get_close_matches(self.name, list(_by_name), n=3, cutoff=0.6)
        hint = f"; close: {', '.join(close)}" if close else "; see `python -m mstx_marks phases`"
        return f"{self.name!r} is not a registered phase or alias{hint}"


_lock = new_lock()
#: How many indexed phases each indexed phase keeps (beyond it, at() builds a fresh one).
_MAX_INDEXED = 4096
#: every phase name and alias -> its phase; the one lookup table
_by_name: dict[str, Phase] = {}
#: phases in registration order, for the table
_phases: list[Phase] = []
# An indexed name: a stem followed by a decimal index ("micro_batch12").
_INDEXED = re.compile(r"(.+?)[0-9]+\Z")


def register(phase: Phase) -> Phase:
    """Add ``phase`` (and its aliases) to the registry and return it.

    Registering the same phase again with the same fields is a no-op; a name or alias already
    mapped to a different phase is a ValueError naming both.

    >>> MY_EVAL = register(Phase("my_eval", "my_team", framework="mine", aliases=("eval_pass",)))
    >>> canonical("eval_pass")
    'my_eval'
    >>> register(Phase("gen"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: cannot register Phase('gen'): 'gen' is already an alias of Phase('generate_seq...')
    """
    if not isinstance(phase, Phase):
        raise TypeError(f"register() takes a Phase, got {type(phase).__name__} {phase!r}")
    with _lock:
        same = _by_name.get(phase.name)
        if same is not None and same._fields() == phase._fields():
            return same
        if same is not None and (same.name, same.domain) == (phase.name, phase.domain):
            raise ValueError(
                f"cannot register {phase!r}: it is already registered with other framework,"
                " description, aliases or indexed"
            )
        for text in (phase.name, *phase.aliases):
            other = _by_name.get(text)
            if other is not None:
                how = "the name of" if other.name == text else "already an alias of"
                raise ValueError(f"cannot register {phase!r}: {text!r} is {how} {other!r}")
        _phases.append(phase)
        for text in (phase.name, *phase.aliases):
            _by_name[text] = phase
    return phase


def lookup(name: str | Phase) -> Phase:
    """The registered phase that ``name`` (a phase name, an alias or an indexed name) denotes.

    Raises :class:`UnknownPhase` (a KeyError) naming close registered names.

    >>> lookup("old_log_p") is COMPUTE_LOG_PROB
    True
    """
    if isinstance(name, Phase):
        name = name.name
    elif not isinstance(name, str):
        raise TypeError(f"phase name must be a str or a Phase, got {type(name).__name__} {name!r}")
    found = _by_name.get(name)
    if found is not None:
        return found
    indexed = _INDEXED.match(name)
    if indexed is not None:
        stem = _by_name.get(indexed.group(1))
        if stem is not None and stem.indexed:
            return stem
    raise UnknownPhase(name)


def canonical(name: str | Phase) -> str:
    """The canonical name of the phase that ``name`` denotes; a KeyError for unknown names.

    >>> canonical("rollout_generate"), canonical("critic_compute_values")
    ('generate_sequences', 'compute_values')
    """
    return lookup(name).name


def all_phases() -> tuple[Phase, ...]:
    """Every registered phase, standard ones first, in registration order."""
    with _lock:
        return tuple(_phases)


def phases_table() -> str:
    """The registry as a text table: name, domain, framework, aliases (``{i}``: indexed).

    >>> print(phases_table().splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
    name  domain  emitted  framework  aliases
    """
    header = ("name", "domain", "emitted", "framework", "aliases")
    rows = [
        (
            p.name + ("{i}" if p.indexed else ""),
            p.domain,
            p.emitted,
            p.framework,
            ", ".join(p.aliases),
        )
        for p in all_phases()
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]

    def line(row: tuple[str, ...]) -> str:
        cells = [cell.ljust(w) for cell, w in zip(row, widths)]
        return "  ".join([*cells, row[4]]).rstrip()

    return "\n".join(line(r) for r in [header, *rows])


def _std(
    name: str,
    framework: str,
    description: str,
    aliases: tuple[str, ...] = (),
    *,
    domain: str | None = None,
    indexed: bool = False,
    emitted: str = "range",
) -> Phase:
    return register(
        Phase(
            name,
            domain,
            framework=framework,
            description=description,
            aliases=aliases,
            indexed=indexed,
            emitted=emitted,
        )
    )


# --- the standard phases, as each framework and version emits them --------------------------
# Read from the published packages (verl 0.6.1-0.9.1, vLLM 0.11-0.33, vllm-ascend 0.11-0.23,
# SGLang 0.5.23, MindSpeed-RL master 2026). verl's stage markers say the method name up to 0.9.0
# and the role from 0.9.1 (update_actor became actor_update); MindSpeed-RL's ranges say the
# method's __qualname__. Aliases are grouped by where they come from.

STEP = _std("step", "verl trainer timer", "one training step")
GENERATE_SEQUENCES = _std(
    "generate_sequences",
    "verl <= 0.7 stage marker; verl agent loop (preset); MindSpeed-RL",
    "rollout: generate responses for a batch of prompts",
    (
        "gen",  # verl trainer timer
        "rollout_generate",  # verl <= 0.7 role
        "gen_max",  # verl <= 0.7 trainer timer (REMAX baseline generation)
        "ActorHybridWorkerBase.generate_sequences",  # MindSpeed-RL range
        "ActorRolloutHybrid.generate_sequences",  # MindSpeed-RL range
        "actor_generate",  # MindSpeed-RL stage
        "rollout",  # MindSpeed-RL timer
    ),
)
COMPUTE_LOG_PROB = _std(
    "compute_log_prob",
    "verl stage marker (0.9.1+: actor_compute_log_prob); MindSpeed-RL",
    "log-probs of the rollout under the current (old) actor",
    (
        "old_log_prob",  # verl trainer timer
        "actor_compute_log_prob",  # verl 0.9.1+ marker; MindSpeed-RL stage
        "ActorHybridWorkerBase.compute_log_prob",  # MindSpeed-RL range
        "Actor.compute_log_prob",  # MindSpeed-RL range (models/actor.py)
        "ActorRolloutHybrid.compute_log_prob",  # MindSpeed-RL range
        "old_log_p",  # MindSpeed-RL timer
    ),
)
COMPUTE_REF_LOG_PROB = _std(
    "compute_ref_log_prob",
    "verl stage marker (0.9.1+: ref_compute_log_prob); MindSpeed-RL",
    "log-probs of the rollout under the reference model",
    (
        "ref",  # verl trainer timer
        "ref_compute_log_prob",  # verl 0.9.1+ marker
        "ReferenceWorkerBase.compute_ref_log_prob",  # MindSpeed-RL range
        "IntegratedWorker.compute_ref_log_prob",  # MindSpeed-RL range
        "Reference.compute_log_prob",  # MindSpeed-RL range (models/reference.py)
        "reference_compute_log_prob",  # MindSpeed-RL stage
        "reference_model",  # MindSpeed-RL timer
    ),
)
COMPUTE_VALUES = _std(
    "compute_values",
    "verl <= 0.7 stage marker; MindSpeed-RL",
    "critic values of the rollout",
    ("values", "CriticWorkerBase.compute_values", "Critic.compute_values", "critic_compute_values"),
)
REWARD = _std(
    "reward",
    "verl trainer timer (legacy trainer; v1 only with a reward model in the training pool)",
    "the whole reward stage of a step",
)
COMPUTE_RM_SCORE = _std(
    "compute_rm_score",
    "verl <= 0.7.0 stage marker; verl 0.7.1+ RewardLoopManager (preset); MindSpeed-RL",
    "scores from a reward model",
    ("Reward.compute_rm_score", "reward_model"),
)
COMPUTE_SCORE = _std(
    "compute_score",
    "verl 0.7.1+ RewardLoopWorker (preset; a metric key in verl's agent loop); MindSpeed-RL",
    "scores from a reward function or rule: in verl one range per trajectory, overlapping",
    ("compute_verifier_score", "rule_reward"),
    emitted="preset",
)
ADV = _std(
    "adv", "verl trainer timer; MindSpeed-RL", "advantage estimation", ("compute_advantage",)
)
UPDATE_CRITIC = _std(
    "update_critic",
    "verl <= 0.7 stage marker; MindSpeed-RL",
    "critic training",
    ("critic_update", "CriticWorkerBase.update", "Critic.update_critic"),
)
UPDATE_ACTOR = _std(
    "update_actor",
    "verl stage marker (0.9.1+: actor_update); MindSpeed-RL",
    "actor (policy) training",
    (
        "Actor.update_actor",  # MindSpeed-RL range (models/actor.py)
        "ActorRolloutHybrid.update_actor",  # MindSpeed-RL range
        "actor_update",
        "ActorHybridWorkerBase.update",
        "update",
    ),
)
TRAIN_BATCH = _std(
    "train_batch",
    "verl 0.8+ TrainingWorker marker",
    "one training batch (one mini-batch) of a TrainingWorker; in 0.9.1 only the critic's fires",
)
TRAIN_MINI_BATCH = _std(
    "train_mini_batch",
    "verl 0.7.1+ TrainingWorker (preset)",
    "one update over all mini-batches (actor update, critic update)",
    emitted="preset",
)
INFER_BATCH = _std(
    "infer_batch",
    "verl 0.7.1+ TrainingWorker (preset)",
    "one forward-only pass (log-probs, critic values)",
    emitted="preset",
)
UPDATE_WEIGHTS = _std(
    "update_weights",
    "verl 0.7.1+ trainer timer",
    "send weights to rollout",
    (
        "sync_rollout_weights",  # verl one-step-off trainer timer
        "timing_s/param_sync",  # verl fully-async trainer timer
    ),
)
# Weight sync, each side apart (verl 0.7.1+): the trainer's `update_weights` timer holds both,
# but on separate trainer and rollout pools (one-step-off, fully async) they run in different
# processes, and the rollout side's first load into the engine is what costs (seconds).
GENERATE_ASYNC = _std(
    "generate_async",
    "verl one-step-off trainer timer",
    "the next step's rollout, launched by the trainer and overlapped with training; timed on the"
    " trainer's event loop, so it ends when the loop next runs after the rollout ended (it"
    " overstates the rollout: generate_sequences, in the agent loop, measures it)",
)
#: Ranges that end when their process next gets round to it, after the work they time ended:
#: each names the phase that measures that work where it runs (the summary says so).
MEASURED_ELSEWHERE: dict[str, str] = {"generate_async": "generate_sequences"}
ACTOR_SEND_WEIGHTS = _std(
    "actor_send_weights",
    "verl 0.7.1+ ActorRolloutRefWorker.update_weights (preset)",
    "weight sync, the actor side: gather the weights and send them through the checkpoint"
    " engine (into the colocated rollout when naive)",
    emitted="preset",
)
ROLLOUT_RECEIVE_WEIGHTS = _std(
    "rollout_receive_weights",
    "verl 0.7.1+ CheckpointEngineWorker.update_weights (preset)",
    "weight sync, the rollout side: receive the weights and load them into the engine",
    emitted="preset",
)
ROLLOUT_PAUSE = _std(
    "rollout_pause",
    "verl 0.7.1+ vLLMHttpServer / SGLangHttpServer.abort_all_requests (preset)",
    "weight sync: the rollout server aborts in-flight requests and pauses generation",
    emitted="preset",
)
ROLLOUT_RESUME = _std(
    "rollout_resume",
    "verl 0.7.1+ vLLMHttpServer / SGLangHttpServer.resume_generation (preset)",
    "weight sync: the rollout server resumes generation",
    emitted="preset",
)
SAVE_CHECKPOINT = _std("save_checkpoint", "verl trainer timer; torch_npu", "checkpoint saving")
TESTING = _std(
    "testing",
    "verl trainer timer",
    "validation run",
    ("rollouter/validate_time",),  # verl fully-async rollouter timer
)
WAIT_FOR_ENOUGH_SAMPLES = _std(
    "wait_for_enough_samples",
    "verl fully-async trainer timer",
    "the trainer waits until the rollouter has enough samples for a step",
)
FORWARD_BACKWARD = _std(
    "forward_backward",
    "verl 0.9.1+ TinkerTrainingWorker marker",
    "one forward-backward pass of the Tinker training worker",
)
DUMP_ROLLOUT = _std(
    "dump_rollout_generations", "verl trainer timer", "writing rollout generations to disk"
)
SWITCH_TO_TRAINER = _std(
    "switch_to_trainer", "verl separate-async trainer timer", "hand the devices to training"
)
SWITCH_WAIT = _std("switch_wait", "verl separate-async trainer timer", "wait for the switch")
SWITCH_TO_ROLLOUT = _std(
    "switch_to_rollout", "verl separate-async trainer timer", "hand the devices to rollout"
)
START_PROFILE = _std("start_profile", "verl legacy trainer timer", "starting the profiler")
STOP_PROFILE = _std("stop_profile", "verl legacy trainer timer", "stopping the profiler")
TOOL_CALLS = _std(
    "tool_calls", "verl agent loop", "tool calls of one agent-loop turn", emitted="metric"
)
MINI_BATCH = _std(
    "mini_batch",
    "verl 0.9.1+ engine_workers",
    "one mini-batch of an update",
    indexed=True,
    emitted="record_function",
)
MICRO_BATCH = _std(
    "micro_batch",
    "verl 0.9.1+ FSDP / torchtitan engines",
    "one micro-batch of a forward-backward loop",
    indexed=True,
    emitted="record_function",
)
DATALOADER = _std("dataloader", "torch_npu", "fetching a batch (torch_npu's own range)")
VLLM_GENERATE_SEQUENCES = _std(
    "vllm_generate_sequences",
    "Ascend RL guide (a hand edit of vLLM)",
    "generation inside the vLLM engine (the guide's own range; no preset emits it)",
    emitted="range",
)
VLLM_ONE_STEP = _std(
    "vllm_one_step",
    "vLLM 0.11-0.33 EngineCore.step / step_with_batch_queue (preset)",
    "one engine step (schedule, forward, sample), in its own domain as in the Ascend RL guide;"
    " with a batch queue (async scheduling, pipeline parallel), one batch from its schedule to"
    " its processed output",
    domain="vllm_one_step",
    emitted="preset",
)
PREFILL_BATCH = _std(
    "prefill_batch",
    "vLLM / vllm-ascend worker, SGLang ModelRunner (preset)",
    "a forward whose batch is all prefill (context phase)",
    ("prefill",),
    emitted="preset",
)
DECODE_BATCH = _std(
    "decode_batch",
    "vLLM / vllm-ascend worker, SGLang ModelRunner (preset)",
    "a forward whose batch is all decode",
    ("decode",),
    emitted="preset",
)
MIXED_BATCH = _std(
    "mixed_batch",
    "vLLM / vllm-ascend worker, SGLang ModelRunner (preset)",
    "a forward whose batch mixes prefill and decode",
    emitted="preset",
)
SAMPLING = _std(
    "sampling",
    "vLLM 0.12+ / vllm-ascend 0.13+ worker sample_tokens (preset)",
    "sampling the next tokens",
    emitted="preset",
)
VERIFY_BATCH = _std(
    "verify_batch",
    "SGLang 0.5 ModelRunner (preset)",
    "a target-model forward verifying a speculative draft (ForwardMode.TARGET_VERIFY)",
    emitted="preset",
)
DRAFT_EXTEND_BATCH = _std(
    "draft_extend_batch",
    "SGLang 0.5 ModelRunner (preset)",
    "a draft-model forward extending the draft after a verify (ForwardMode.DRAFT_EXTEND(_V2))",
    emitted="preset",
)
SGLANG_FORWARD = _std(
    "sglang_forward",
    "SGLang (a hand edit)",
    "one SGLang model-runner forward, in its own domain (a hand edit's range; the preset emits"
    " prefill_batch / decode_batch / ... in domain sglang instead)",
    domain="sglang_forward",
    emitted="range",
)
TRANSFER_DOCK_DISPATCH = _std(
    "transfer_dock_dispatch",
    "MindSpeed-RL range",
    "a worker fetches its input from the transfer dock",
    ("BaseWorker.dispatch_transfer_dock_data",),
)
TRANSFER_DOCK_COLLECT = _std(
    "transfer_dock_collect",
    "MindSpeed-RL range",
    "a worker puts its output into the transfer dock",
    ("BaseWorker.collect_transfer_dock_data", "BaseWorker.collect_transfer_dock_mm_data"),
)
OFFLOAD = _std(
    "offload",
    "MindSpeed-RL range",
    "move training state (params, grads, optimizer) from the device to the host",
    (
        "MegatronOffLoader.offload_param",
        "MegatronOffLoader.offload_grad",
        "MegatronOffLoader.offload_optimizer",
        "MegatronOffLoader.swap_tensors_to_host",
    ),
)
ONLOAD = _std(
    "onload",
    "MindSpeed-RL range",
    "move training state (params, grads, optimizer) back from the host to the device",
    (
        "MegatronOffLoader.onload_param",
        "MegatronOffLoader.onload_grad",
        "MegatronOffLoader.onload_optimizer",
        "MegatronOffLoader.swap_tensors_to_device",
    ),
)
OFFLOAD_INFER_PARAMS = _std(
    "offload_infer_params",
    "MindSpeed-RL range",
    "free the inference engine's weight buffers (inside resharding_to_infer)",
    ("MegatronShardingManager.offload_infer_params",),
)
ONLOAD_INFER_PARAMS = _std(
    "onload_infer_params",
    "MindSpeed-RL range",
    "rebuild the inference engine's weight buffers (inside resharding_to_infer)",
    ("MegatronShardingManager.onload_infer_params",),
)
MOVE_TO_DEVICE = _std(
    "move_to_device",
    "MindSpeed-RL range",
    "copy one group of tensors between host and device (inside offload and onload)",
    ("MegatronOffLoader._move_to_device",),
)
RESHARDING_TO_FORWARD = _std(
    "resharding_to_forward",
    "MindSpeed-RL range",
    "bring the training weights back for a forward-only pass (log-probs) and offload them after",
    ("MegatronShardingManager.enter_forward_mode", "MegatronShardingManager.exit_forward_mode"),
)
COMPUTE_IMAGE_EMBEDS = _std(
    "compute_image_embeds",
    "MindSpeed-RL range",
    "the vision encoder's image embeddings of a multimodal batch",
    (
        "VitWorkerBase.compute_image_embeds",
        "ActorHybridWorkerBase.compute_image_embeds",
        "Actor.compute_image_embeds",
        "ActorRolloutHybrid.compute_image_embeds",
    ),
)
ALL_CONSUMED = _std(
    "all_consumed",
    "MindSpeed-RL range",
    "a worker asks the transfer dock how much of its stage's experience is left",
    ("BaseWorker.all_consumed",),
)
EMPTY_CACHE = _std(
    "empty_cache",
    "MindSpeed-RL range",
    "release the device memory cache between stages",
    ("BaseWorker.empty_cache",),
)
PAD_EXPERIENCE = _std(
    "pad_experience",
    "MindSpeed-RL range",
    "pad a batch of variable-length experience into tensors",
    ("padding_dict_to_tensor_dict",),
)
UNPAD_EXPERIENCE = _std(
    "unpad_experience",
    "MindSpeed-RL range",
    "strip the padding from a batch of experience",
    ("remove_padding_tensor_dict_to_dict", "remove_padding_and_split_to_list"),
)
RESHARDING_TO_INFER = _std(
    "resharding_to_infer",
    "MindSpeed-RL timer",
    "reshard actor weights from training to inference",
    ("MegatronShardingManager.enter_infer_mode", "MegatronShardingManager.exit_infer_mode"),
)
RESHARDING_TO_TRAIN = _std(
    "resharding_to_train",
    "MindSpeed-RL timer",
    "reshard actor weights back to the training layout",
    ("MegatronShardingManager.enter_train_mode", "MegatronShardingManager.exit_train_mode"),
)
