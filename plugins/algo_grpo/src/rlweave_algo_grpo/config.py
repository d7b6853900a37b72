"""Settings of ``algorithm.name: grpo`` (the keys beside ``name`` in the ``algorithm`` section).

GRPO here is the family of critic-free group methods: the advantage estimator
(``advantage``: grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, remax, or a
plugin's), the policy loss (``policy_loss``: ppo_clip, gspo, cispo...), the loss aggregation
and the KL estimator are named parts (:mod:`rlweave.algo_parts`), so RLOO or GSPO is one key,
not another algorithm.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional

from pydantic import ConfigDict, Field, field_validator, model_validator

from rlweave.algo_helpers.multi_turn_config import MultiTurnKeys
from rlweave.algo_helpers.reward_models import RewardModelEntry, check_entries
from rlweave.algo_helpers.sampling import SamplingConfig
from rlweave.algo_parts.config import KLSection, PolicyParts
from rlweave.algo_parts.offpolicy import OffPolicyConfig
from rlweave.algo_parts.spec import PartSpec, resolve

#: keys of earlier versions -> where their setting lives now
MOVED = {
    **PolicyParts.moved_keys,
    "scale_rewards": "use advantage: grpo (scaled) or advantage: dr_grpo (not scaled)",
    "adv_eps": "use advantage: {name: grpo, eps: ...}",
    "kl_beta": "use kl: {beta: ...}",
    "kl_estimator": "use kl: {estimator: ...}",
    "kl_in_reward": "use kl: {in_reward: true}",
}


class GRPOConfig(SamplingConfig, MultiTurnKeys, PolicyParts):
    """The shared sampling keys (:class:`~rlweave.algo_helpers.sampling.SamplingConfig`), the policy
    update's named parts (:class:`~rlweave.algo_parts.config.PolicyParts`) and GRPO's own."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["grpo"] = Field("grpo", description="Algorithm name.")
    # sampling (the rest: SamplingConfig)
    n_samples: int = Field(8, ge=1, description="Responses sampled per prompt (the group size).")
    ignore_eos: bool = Field(False, description="Always generate max_new_tokens (benchmarks: equal work per sample).")
    # named parts
    advantage: PartSpec = Field(
        PartSpec("grpo"), description="Advantage estimator: grpo, dr_grpo, rloo, reinforce_pp, "
        "reinforce_pp_baseline, remax, a plugin's, or module:function; {name: ..., <options>} sets its options."
    )
    kl: KLSection = Field(default_factory=KLSection, description="KL to the reference model.")
    off_policy: OffPolicyConfig = Field(
        default_factory=OffPolicyConfig,
        description="Off-policy correction of the policy loss against the engine's (behaviour) log-probs: a named "
        "rollout correction (truncated or masked importance sampling, IcePop, geometric-mean rejection...) and where "
        "the old policy comes from (rlweave.algo_parts.offpolicy).",
    )
    # rewards
    reward_models: list[RewardModelEntry] = Field(
        default_factory=list, description="Learned reward models (roles, model_type: reward) summed with weights; "
        "the top-level 'rewards' rules are added on top."
    )
    # DAPO extras
    dynamic_sampling: bool = Field(False, description="Drop groups whose rewards all agree and draw more prompts.")
    max_resample: int = Field(2, ge=0, description="Extra generation rounds at most when dynamic sampling.")
    overlong_buffer: int = Field(
        0, ge=0, description="Soft overlong penalty over the last k tokens before max_new_tokens (0: off)."
    )
    overlong_penalty: float = Field(1.0, ge=0, description="Penalty at max_new_tokens for the soft overlong penalty.")
    # updates
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch.")
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per pass (the batch is split).")
    shuffle_mini_batches: bool = Field(True, description="Shuffle samples before splitting into mini-batches.")
    # mixture-of-experts
    router_replay: Literal["none", "r2", "r3"] = Field(
        "none", description="MoE router replay (docs/moe.md): none; r2: the experts the old-log-prob pass chose are "
        "replayed in the updates; r3: the experts the rollout engine chose, per token, are replayed in the "
        "old-log-prob pass and the updates. Needs an MoE policy on a backend that replays (fsdp, megatron) and, "
        "for r3, an engine that records routing (hf)."
    )
    # evaluation
    eval_reward: Optional[str] = Field(
        None,
        description="Rule reward (name or module:function) deciding held-out correctness; null: the 'rewards' set.",
    )
    eval_max_new_tokens: int = Field(32, ge=1, description="Longest response at evaluation.")
    eval_threshold: float = Field(1.0, description="A held-out sample is correct when its reward is >= this.")

    moved_keys: ClassVar[dict[str, str]] = MOVED

    @field_validator("advantage")
    @classmethod
    def _advantage(cls, v: PartSpec) -> PartSpec:
        if "values" in resolve("advantage", v).needs:  # an unknown name or bad options raise here
            raise ValueError(f"advantage estimator '{v.name}' needs a critic's values; grpo has no critic "
                             "(use algorithm.name: ppo)")
        return v

    @model_validator(mode="after")
    def _check(self) -> "GRPOConfig":
        if self.overlong_buffer >= self.max_new_tokens and self.overlong_buffer:
            raise ValueError(
                f"overlong_buffer ({self.overlong_buffer}) must be smaller than max_new_tokens ({self.max_new_tokens})"
            )
        check_entries(self.reward_models)
        if self.router_replay == "r3" and self.multi_turn is not None:
            raise ValueError("router_replay r3 replays the routing of one engine continuation per sample; multi_turn "
                             "episodes do not record it: use router_replay r2 or none")
        if self.needs_baseline and self.dynamic_sampling:
            raise ValueError(f"advantage '{self.advantage.name}' needs a greedy baseline per prompt, which "
                             "dynamic_sampling does not keep: turn one of them off")
        return self

    @property
    def needs_baseline(self) -> bool:
        """Whether the estimator needs the reward of a greedy response per prompt (ReMax)."""
        return "baseline" in resolve("advantage", self.advantage).needs


def _validated(cfg: Any) -> GRPOConfig:
    return cfg if isinstance(cfg, GRPOConfig) else GRPOConfig.model_validate(dict(cfg))


def grpo_roles(cfg: GRPOConfig) -> tuple[str, ...]:
    """Roles GRPO needs: the trained policy, the rollout engine, a reference model only when
    the KL coefficient is non-zero, and the reward-model roles it lists."""
    cfg = _validated(cfg)
    ref = ("reference",) if cfg.kl.enabled else ()
    return ("policy", "rollout") + ref + tuple(e.role for e in cfg.reward_models)


def grpo_run_modes(cfg: GRPOConfig) -> tuple[str, ...]:
    """``run.mode`` values GRPO implements as configured: dynamic sampling draws prompts until a
    step's groups disagree and ReMax generates a greedy baseline with each batch, so these need
    sync steps; otherwise every built-in mode (the rollout says which of them it supports)."""
    cfg = _validated(cfg)
    if cfg.dynamic_sampling or cfg.needs_baseline:
        return ("sync",)
    return ("sync", "one_step_off", "async")


def grpo_partial_rollout(cfg: GRPOConfig) -> bool:
    """Whether ``rollout.partial`` works with this GRPO config (not with dynamic sampling or
    ReMax)."""
    return len(grpo_run_modes(_validated(cfg))) > 1
