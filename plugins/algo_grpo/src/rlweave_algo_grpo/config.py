"""Settings of ``algorithm.name: grpo`` (the keys beside ``name`` in the ``algorithm`` section)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rlweave.algo_helpers.offpolicy import OffPolicyConfig
from rlweave.algo_helpers.sampling import SamplingConfig


class GRPOConfig(SamplingConfig):
    """The shared sampling keys (:class:`~rlweave.algo_helpers.sampling.SamplingConfig`) and GRPO's own."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["grpo"] = Field("grpo", description="Algorithm name.")
    # sampling (the rest: SamplingConfig)
    n_samples: int = Field(8, ge=1, description="Responses sampled per prompt (the group size).")
    ignore_eos: bool = Field(False, description="Always generate max_new_tokens (benchmarks: equal work per sample).")
    # policy loss
    clip_low: float = Field(0.2, ge=0, description="Lower clip range: ratio >= 1 - clip_low.")
    clip_high: float = Field(
        0.2, ge=0, description="Upper clip range: ratio <= 1 + clip_high (DAPO clip-higher: 0.28)."
    )
    loss_agg: Literal["token_mean", "seq_mean"] = Field(
        "token_mean", description="Loss aggregation: mean over all response tokens, or per-sample mean then mean."
    )
    scale_rewards: bool = Field(True, description="Divide group-centred rewards by the group std (false: Dr.GRPO).")
    adv_eps: float = Field(1e-6, gt=0, description="Added to the group std before dividing.")
    off_policy: OffPolicyConfig = Field(
        default_factory=OffPolicyConfig,
        description="Off-policy correction of the policy loss against the engine's (behaviour) log-probs: "
        "truncated importance sampling or decoupled PPO (rlweave.algo_helpers.offpolicy).",
    )
    # KL to the reference model
    kl_beta: float = Field(0.0, ge=0, description="KL coefficient; 0 starts no reference role.")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="Per-token KL estimator.")
    kl_in_reward: bool = Field(False, description="Subtract beta * sequence KL from the reward instead of a loss term.")
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
    # evaluation
    eval_max_new_tokens: int = Field(32, ge=1, description="Longest response at evaluation.")
    eval_threshold: float = Field(1.0, description="A held-out sample is correct when its reward is >= this.")

    @model_validator(mode="after")
    def _check(self) -> "GRPOConfig":
        if self.overlong_buffer >= self.max_new_tokens and self.overlong_buffer:
            raise ValueError(
                f"overlong_buffer ({self.overlong_buffer}) must be smaller than max_new_tokens ({self.max_new_tokens})"
            )
        if self.kl_in_reward and self.kl_beta == 0:
            raise ValueError("kl_in_reward needs kl_beta > 0")
        return self


def grpo_roles(cfg: GRPOConfig) -> tuple[str, ...]:
    """Roles GRPO needs: the trained policy, the rollout engine, and a reference model
    only when the KL coefficient is non-zero."""
    beta = cfg.kl_beta if isinstance(cfg, GRPOConfig) else float(dict(cfg).get("kl_beta", 0.0))
    return ("policy", "rollout") + (("reference",) if beta > 0 else ())


def grpo_run_modes(cfg: GRPOConfig) -> tuple[str, ...]:
    """``run.mode`` values GRPO implements as configured: dynamic sampling draws prompts until a
    step's groups disagree, which needs sync steps."""
    dynamic = cfg.dynamic_sampling if isinstance(cfg, GRPOConfig) else bool(dict(cfg).get("dynamic_sampling", False))
    return ("sync",) if dynamic else ("sync", "one_step_off", "async")


def grpo_partial_rollout(cfg: GRPOConfig) -> bool:
    """Whether ``rollout.partial`` works with this GRPO config (not with dynamic sampling)."""
    return len(grpo_run_modes(cfg)) > 1
