"""Typed records that plugins return from their hooks.

Every plugin kind returns records of one type. A record is cheap to build: it names the
plugin, says in one line what it does, carries the plugin's own pydantic config model
(a light module, no torch), and points at the heavy code with an import string that is
resolved only by :meth:`PluginRecord.load`, i.e. only when a run selects the plugin.

Every record may carry a cheap ``probe()`` saying whether it can run on this machine:
``None`` when it can, else the reason (not installed, needs CUDA, not implemented yet...).
``rlweave list-plugins`` shows a record whose probe gives a reason as ``unavailable`` with that
reason, and selecting it in a config is a validation error quoting it. A probe must stay
light: look for a package with ``importlib.util.find_spec``, never import torch or ray.

Example (in a plugin's light ``plugin.py`` module)::

    from rlweave.plugins import hookimpl, BackendRecord
    from my_backend.config import MyBackendConfig   # pydantic, no torch

    @hookimpl
    def rlweave_training_backends():
        return [BackendRecord(name="mine", summary="My backend on torch",
                              target="my_backend.worker:MyWorker",
                              config_model=MyBackendConfig)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from pydantic import BaseModel

from rlweave import PLUGIN_API_VERSION
from rlweave.targets import import_target


def _always_available() -> str | None:
    return None


@dataclass(frozen=True)
class PluginRecord:
    """What every plugin kind has in common.

    Attributes:
        name: the name users write in YAML (unique within one kind).
        summary: one line for ``rlweave list-plugins``.
        target: ``"module:attribute"`` of the heavy object, imported by :meth:`load`.
        config_model: pydantic model validating this plugin's own YAML section
            (``None`` when the plugin takes no options). A backend's or engine's ranks receive
            the validated instance as ``WorkerContext.options``.
        api_version: the plugin-API version the plugin was built for; a record with a
            different version than ``rlweave.PLUGIN_API_VERSION`` is ``incompatible``.
        probe: ``() -> None | reason``: ``None`` when the record can run here, else why not
            (shown by ``list-plugins`` as ``unavailable``; selecting it is a config error).
            Keyword-only; default: always available. Called once per plugin manager; it must
            stay cheap and light (no torch/ray import).
    """

    kind: ClassVar[str] = "plugin"

    name: str
    summary: str
    target: str
    config_model: type[BaseModel] | None = None
    api_version: int = PLUGIN_API_VERSION
    probe: Callable[[], str | None] = field(default=_always_available, kw_only=True)

    def load(self) -> Any:
        """Import and return the heavy object (worker class, algorithm class, function)."""
        return import_target(self.target)


def _nothing_to_refuse(role: str, section: Any, model: Any) -> list[tuple[str, str]]:
    return []


@dataclass(frozen=True)
class BackendRecord(PluginRecord):
    """A training backend: ``load()`` returns a :class:`rlweave.interfaces.TrainingWorker`
    subclass that trains and/or scores one model on one rank.

    ``model_types`` lists what it can build (``"causal_lm"``, ``"value"``, ``"reward"``);
    ``parallel`` lists the parallel sizes it understands (``"dp"``, ``"tp"``, ``"pp"``...).

    ``check`` is a light function ``(role, role section, model section) -> [(key path,
    message)]`` run by validation (``rlweave validate``, and before any worker starts) after
    the role's options were validated: what only this backend knows to refuse, such as
    parallel sizes the model's shape does not allow. It must not import torch; it may read
    the model directory's ``config.json``. Default: nothing to refuse.

    ``kernels`` names the kernels (``kernels.<name>``) its workers use when a run selects them: a
    selected one reaches each rank as ``WorkerContext.kernel(name)``.

    ``lora``: its workers train LoRA adapters when ``WorkerContext.lora`` is set
    (``roles.<role>.lora``) and take ``compute_logprobs(..., adapters=False)`` (the base model's
    log-probs: a reference without a reference role); validation refuses ``lora`` otherwise.

    ``router_replay``: for MoE models its workers replay a batch's ``routing`` token field in every
    pass and take ``compute_logprobs(..., with_routing=True)`` (:mod:`rlweave.backend_helpers.router_replay`);
    ``algorithm.router_replay`` refuses a policy backend without it.

    ``vision``: it trains vision-language models (:mod:`rlweave.data.vision`): its workers take
    batches whose samples carry images (``Batch.mm``); validation refuses such a model otherwise.
    """

    kind: ClassVar[str] = "backend"
    model_types: tuple[str, ...] = ("causal_lm", "value", "reward")
    parallel: tuple[str, ...] = ("dp",)
    kernels: tuple[str, ...] = ()
    lora: bool = False
    router_replay: bool = False
    vision: bool = False
    check: Callable[[str, Any, Any], list[tuple[str, str]]] = field(default=_nothing_to_refuse, kw_only=True)


@dataclass(frozen=True)
class EngineRecord(PluginRecord):
    """An inference engine: ``load()`` returns a :class:`rlweave.interfaces.RolloutEngine`
    subclass. ``parallel`` lists supported parallel sizes (``"tp"`` etc.).

    ``rank_spans`` lists the parallel sizes that one rank spans: a rank of such an engine is
    one whole replica that drives its own workers (vLLM's tensor-parallel processes) on
    ``product(roles.<role>.parallel[k] for k in rank_spans)`` devices. The scheduler then
    starts one rank per replica, ``devices // that product`` ranks, and makes all of the
    replica's devices visible to the rank's process (``CUDA_VISIBLE_DEVICES``), so the
    processes the engine starts inherit them. Default ``()``: one rank per device.

    ``lora``: it serves a LoRA policy's adapter itself (``weight_sync.lora: adapter``): its
    workers get the policy's ``WorkerContext.lora`` and take ``load_adapter(folder, sha256)``.

    ``deterministic``: one seed and one set of weights give identical generations, run after run
    (``SamplingParams.seed``, with torch's deterministic algorithms on); ``run.deterministic``
    refuses an engine that does not promise it.

    ``routing``: for MoE models it reports the experts each token was routed to
    (``SamplingParams.return_routing``, ``Generation.routing``); ``algorithm.router_replay: r3``
    refuses an engine that does not.

    ``vision``: it generates from prompts with images (:class:`rlweave.interfaces.engine.VisionPrompt`)
    with vision-language models; validation refuses such a model otherwise.
    """

    kind: ClassVar[str] = "engine"
    parallel: tuple[str, ...] = ()
    rank_spans: tuple[str, ...] = ()
    lora: bool = False
    deterministic: bool = False
    routing: bool = False
    vision: bool = False


def _no_roles(config: Any) -> tuple[str, ...]:
    return ()


def _train_and_eval(config: Any) -> tuple[str, ...]:
    return ("train", "eval")


@dataclass(frozen=True)
class AlgorithmRecord(PluginRecord):
    """An algorithm: ``load()`` returns a :class:`rlweave.interfaces.Algorithm` subclass.

    ``roles`` is a light function ``(validated algorithm config) -> role names`` so the
    placement can be checked before any worker starts (e.g. GRPO with ``kl: {beta: 0}``
    needs no ``reference``).

    ``run_modes``: the ``run.mode`` values the algorithm implements (``"sync"`` always), or a
    light function ``(validated algorithm config) -> modes``; ``partial_rollout``: whether it
    implements ``rollout.partial`` (or a function of its config). A config asking for more
    fails validation naming the key.

    ``rollout``: it samples through the rollout seam (:mod:`rlweave.interfaces.rollout`), so
    ``rollout.name`` and ``rollout.args`` apply to it; validation refuses them otherwise.

    ``reward_data`` is a light function ``(validated algorithm config) -> data sections``
    (``"train"``, ``"eval"``) whose records the configured ``rewards`` score; validation
    dry-runs each reward on the first record of each (default: both). An algorithm that
    uses rewards only to judge held-out answers (SFT, DPO) returns ``("eval",)``.
    """

    kind: ClassVar[str] = "algorithm"
    roles: Callable[[Any], tuple[str, ...]] = field(default=_no_roles)
    reward_data: Callable[[Any], tuple[str, ...]] = field(default=_train_and_eval)
    run_modes: "tuple[str, ...] | Callable[[Any], tuple[str, ...]]" = ("sync",)
    partial_rollout: "bool | Callable[[Any], bool]" = False
    rollout: bool = False


@dataclass(frozen=True)
class RewardRecord(PluginRecord):
    """A reward: ``load()`` returns a callable
    ``fn(prompt: str, response: str, **fields) -> float`` (rule rewards), where
    ``fields`` are the extra keys of the data record (e.g. ``answer``)."""

    kind: ClassVar[str] = "reward"


@dataclass(frozen=True)
class KernelRecord(PluginRecord):
    """An optional fast path. Its ``probe()`` (see :class:`PluginRecord`) says whether it is
    usable on this machine (no GPU, missing Triton...). ``target`` points at the kernel object
    itself (not a class): backends that use the kernel (``BackendRecord.kernels``) receive it on
    their ranks as ``WorkerContext.kernel(name)``; what the object offers is between the kernel
    and the backends that use it."""

    kind: ClassVar[str] = "kernel"


@dataclass(frozen=True)
class AdvantageRecord(PluginRecord):
    """An advantage estimator (:mod:`rlweave.algo_parts.advantages` states the calling
    convention): ``load()`` returns ``fn(*, scores, groups, mask, cu_seqlens, token_rewards,
    values, baseline, **options) -> (advantages, returns | None)``.

    ``needs`` names the inputs the algorithm must provide beyond rewards and groups:
    ``"values"`` (a critic) or ``"baseline"`` (the reward of one extra greedy response per prompt,
    ReMax); an algorithm that cannot provide one refuses the estimator at validation.
    ``loss_agg``: the loss aggregation used when the config names none (None: ``token_mean``).
    ``config_model`` validates the estimator's options."""

    kind: ClassVar[str] = "advantage"
    needs: tuple[str, ...] = ()
    loss_agg: str | None = None


@dataclass(frozen=True)
class PolicyLossRecord(PluginRecord):
    """A policy loss (:mod:`rlweave.algo_parts.policy_losses`): ``load()`` returns
    ``fn(logp, old_logp, advantages, *, mask, cu_seqlens, **options) -> (loss_t, info)``.
    ``loss_agg``: the aggregation it pairs with when the config names none (before the
    estimator's)."""

    kind: ClassVar[str] = "policy_loss"
    loss_agg: str | None = None


@dataclass(frozen=True)
class KLRecord(PluginRecord):
    """A per-token KL estimator (:mod:`rlweave.algo_parts.kl`): ``load()`` returns
    ``fn(logp, ref_logp) -> kl_t``."""

    kind: ClassVar[str] = "kl"


@dataclass(frozen=True)
class LossAggRecord(PluginRecord):
    """A loss aggregation (:mod:`rlweave.algo_parts.aggregation`): ``load()`` returns
    ``fn(mask, cu_seqlens, *, max_len, **options) -> token weights``."""

    kind: ClassVar[str] = "loss_agg"


@dataclass(frozen=True)
class CorrectionRecord(PluginRecord):
    """A rollout correction (:mod:`rlweave.algo_parts.corrections` states the calling
    convention): ``load()`` returns ``fn(log_ratio, *, active, sample_index, num_samples,
    **options) -> Correction``, the stop-gradient factor of each token's policy-gradient term
    from the log-ratio of the proximal to the behaviour policy.

    ``needs``: ``("proximal",)`` when the correction needs the proximal policy recomputed before
    the update (the algorithm then always runs that pass; ``off_policy.mode: bypass``, which skips
    it, is refused). ``config_model`` validates its options."""

    kind: ClassVar[str] = "rollout_correction"
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnvironmentRecord(PluginRecord):
    """An environment of multi-turn rollouts: ``load()`` returns a
    :class:`rlweave.interfaces.environment.Environment` subclass, built once per episode as
    ``cls(args)`` with ``args`` its validated ``config_model`` instance (or ``{}``)."""

    kind: ClassVar[str] = "environment"


@dataclass(frozen=True)
class ToolParserRecord(PluginRecord):
    """A tool-call parser of the ``tools`` environment: ``load()`` returns ``fn(text) -> (calls,
    problems)`` (:mod:`rlweave.environments.parsers`). ``call_format``: how a call is written,
    for the system message that tells the model (empty: the message does not say)."""

    kind: ClassVar[str] = "tool_parser"

    call_format: str = ""


def _no_settings_to_check(run_config: Any, settings: Any, pm: Any) -> list[tuple[str, str]]:
    return []


def _modes_of_a_plain_rollout() -> tuple[str, ...]:
    return ("sync", "one_step_off")


@dataclass(frozen=True)
class RolloutRecord(PluginRecord):
    """A rollout: how data records become trajectories (:mod:`rlweave.interfaces.rollout`).
    ``load()`` returns a :class:`~rlweave.interfaces.rollout.Rollout` subclass, built once per
    run with ``cls.create(RolloutContext)``; ``config_model`` validates ``rollout.args``.

    What the run modes may do with it (light facts, read by validation before anything starts):

    * ``run_modes``: the ``run.mode`` values it supports. Default ``("sync", "one_step_off")``: a
      rollout the controller calls (``Rollout.run``), in a background thread one step ahead in
      ``one_step_off``.
    * ``streams``: its generation is one engine request per record that the rollout queue issues,
      splits and continues itself (the single-turn rollout): ``async`` and token-budget partial
      rollout of single continuations need it.
    * ``resumable``: its trajectories can be cut at a token budget and continued in a later round
      (``episodes(..., budget)``, the multi-turn rollout): partial rollout of episodes needs it.

    ``check`` is a light function ``(run config, settings, plugin manager) -> [(key path, message)]``
    run by validation on the rollout's validated settings (``rollout.args``, or
    ``algorithm.multi_turn`` for the multi-turn rollout): what only the rollout knows to refuse,
    such as an environment it cannot find or arguments that environment does not take.
    """

    kind: ClassVar[str] = "rollout"
    run_modes: tuple[str, ...] = field(default_factory=_modes_of_a_plain_rollout)
    streams: bool = False
    resumable: bool = False
    check: Callable[[Any, Any, Any], list[tuple[str, str]]] = field(default=_no_settings_to_check, kw_only=True)

    @property
    def partial(self) -> bool:
        """Whether ``rollout.partial`` works with it."""
        return self.streams or self.resumable


def _nothing_to_check(run_config: Any, rollout: Any) -> list[tuple[str, str]]:
    return []


@dataclass(frozen=True)
class RunModeRecord(PluginRecord):
    """A run mode (``run.mode``): how generation and training take turns. ``load()`` returns
    ``build(ctx, rollout, record, n, max_new_tokens) -> Pipeline``
    (:class:`rlweave.interfaces.pipeline.Pipeline`): what feeds an algorithm's steps in this mode,
    given the run context, the built rollout and its :class:`RolloutRecord`, and the algorithm's
    samples per record and longest response.

    ``check`` is a light function ``(run config, rollout record) -> [(key path, message)]`` run by
    validation: what this mode needs of the run (staleness bound, devices of its own for the
    rollout role...). Whether the algorithm and the rollout support the mode is checked by the
    caller from their records.
    """

    kind: ClassVar[str] = "run_mode"
    check: Callable[[Any, Any], list[tuple[str, str]]] = field(default=_nothing_to_check, kw_only=True)


RECORD_TYPES: dict[str, type[PluginRecord]] = {
    r.kind: r for r in (BackendRecord, EngineRecord, AlgorithmRecord, RewardRecord, KernelRecord,
                        AdvantageRecord, PolicyLossRecord, KLRecord, LossAggRecord, CorrectionRecord, EnvironmentRecord,
                        ToolParserRecord, RolloutRecord, RunModeRecord)
}
