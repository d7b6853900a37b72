"""Settings of ``algorithm.name: ppo`` (the keys beside ``name`` in the ``algorithm`` section).

Light module (pydantic only): the plugin record carries it so ``rlweave train`` validates a
PPO config before any worker starts.
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
    "gamma": "use advantage: {name: gae, gamma: ..., lam: ...}",
    "lam": "use advantage: {name: gae, gamma: ..., lam: ...}",
    "kl_coef": "use kl: {beta: ...}",
    "kl_estimator": "use kl: {estimator: ...}",
    "kl_clamp": "use kl: {clamp: ...}",
    "kl_target": "use kl: {target: ...}",
    "kl_horizon": "use kl: {horizon: ...}",
}


class PPOKLSection(KLSection):
    """``algorithm.kl`` with PPO's defaults: the classic RLHF penalty, k1 per token in the reward,
    coefficient 0.05 (set ``in_reward: false`` for a KL loss term as in GRPO)."""

    beta: float = Field(0.05, ge=0, description="KL coefficient (the initial one with target); 0 without target "
                        "starts no reference role.")
    estimator: PartSpec = Field(PartSpec("k1"), description="Per-token KL estimator: k1, k2, k3 or a plugin's.")
    in_reward: bool = Field(True, description="Put -beta * KL into the reward per token (PPO's classic penalty) "
                            "instead of a loss term.")


class PPOConfig(SamplingConfig, MultiTurnKeys, PolicyParts):
    """The shared sampling keys (:class:`~rlweave.algo_helpers.sampling.SamplingConfig`), the policy
    update's named parts (:class:`~rlweave.algo_parts.config.PolicyParts`) and PPO's own."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["ppo"] = Field("ppo", description="Algorithm name.")
    # rewards
    reward_models: list[RewardModelEntry] = Field(
        default_factory=lambda: [RewardModelEntry()],
        description="Learned reward models (roles) summed with weights; the top-level 'rewards' rules are "
        "added on top.",
    )
    reward_norm: Literal["none", "batch", "running", "group"] = Field(
        "none",
        description="Normalise sequence rewards: per batch, with running statistics, per prompt (group of "
        "n_samples: removes a reward model's per-prompt offset), or not.",
    )
    reward_clip: Optional[float] = Field(None, gt=0, description="Clip sequence rewards to [-c, c] after normalising.")
    # KL to the reference (in the reward by default)
    kl: PPOKLSection = Field(default_factory=PPOKLSection, description="KL to the reference model.")
    # advantages
    advantage: PartSpec = Field(
        PartSpec("gae"), description="Advantage estimator using the critic's values: gae (options gamma, lam) "
        "or a plugin's."
    )
    normalize_advantages: bool = Field(True, description="Whiten advantages with global batch statistics.")
    # policy loss
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus coefficient (0: off).")
    off_policy: OffPolicyConfig = Field(
        default_factory=OffPolicyConfig,
        description="Off-policy correction of the policy loss against the engine's (behaviour) log-probs: a named "
        "rollout correction (truncated or masked importance sampling, IcePop, geometric-mean rejection...) and where "
        "the old policy comes from (rlweave.algo_parts.offpolicy).",
    )
    # critic
    value_clip: Optional[float] = Field(
        0.2, gt=0, description="Value clipping range around the old values (null: off)."
    )
    critic_warmup_steps: int = Field(0, ge=0, description="Steps at the start that train only the critic.")
    # updates
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch.")
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per pass (the batch is split).")
    shuffle_mini_batches: bool = Field(True, description="Shuffle samples before splitting into mini-batches.")
    # pre-training (ptx) term
    ptx_coef: float = Field(0.0, ge=0, description="Weight of the supervised (ptx) loss mixed into each policy update.")
    ptx_data: Optional[str] = Field(
        None, description="jsonl of {query, response} for the ptx term (needed if ptx_coef > 0)."
    )
    ptx_batch_size: int = Field(8, ge=1, description="ptx records added to each policy mini-batch.")
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
        if "values" not in resolve("advantage", v).needs:  # an unknown name or bad options raise here
            raise ValueError(f"advantage estimator '{v.name}' uses no critic, and ppo trains one: use "
                             "algorithm.name: grpo for critic-free estimators")
        return v

    @model_validator(mode="after")
    def _check(self) -> "PPOConfig":
        if self.ptx_coef > 0 and not self.ptx_data:
            raise ValueError("ptx_coef > 0 needs ptx_data (a jsonl of {query, response})")
        check_entries(self.reward_models)
        return self

    @property
    def uses_reference(self) -> bool:
        return self.kl.enabled


def _validated(cfg: Any) -> PPOConfig:
    return cfg if isinstance(cfg, PPOConfig) else PPOConfig.model_validate({k: v for k, v in dict(cfg).items()})


def ppo_run_modes(cfg: PPOConfig) -> tuple[str, ...]:
    """``run.mode`` values PPO implements: every built-in mode (the rollout says which of them it
    supports)."""
    return ("sync", "one_step_off", "async")



def ppo_roles(cfg: PPOConfig) -> tuple[str, ...]:
    """Roles PPO needs: policy, rollout, critic, the reward-model roles, and the reference
    unless the KL penalty is off (``kl_coef: 0`` and no ``kl_target``)."""
    cfg = _validated(cfg)
    ref = ("reference",) if cfg.uses_reference else ()
    return ("policy", "rollout") + ref + ("critic",) + tuple(e.role for e in cfg.reward_models)
