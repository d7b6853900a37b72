"""Settings of ``algorithm.name: dpo`` and ``algorithm.name: online_dpo`` (the keys beside
``name`` in the ``algorithm`` section). Light: pydantic only."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlweave.algo_helpers.multi_turn_config import MultiTurnKeys
from rlweave.algo_helpers.reward_models import RewardModelEntry
from rlweave.algo_helpers.sampling import SamplingConfig


class PreferenceLossConfig(BaseModel):
    """Loss settings shared by DPO and OnlineDPO (see ``rlweave_algo_dpo.loss``)."""

    model_config = ConfigDict(extra="forbid")

    beta: float = Field(0.1, gt=0, description="Inverse temperature of the implicit reward beta * log(pi/pi_ref).")
    loss_type: Literal["sigmoid", "conservative", "ipo", "hinge"] = Field(
        "sigmoid", description="sigmoid: DPO; conservative: cDPO (label smoothing); ipo: IPO; hinge: SLiC."
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="Probability that a preference label is flipped (sigmoid/conservative)."
    )
    sft_coef: float = Field(0.0, ge=0, description="Weight of an NLL (SFT) term on the chosen responses (0: off).")
    average_logprobs: bool = Field(
        False, description="Use per-token mean instead of summed sequence log-probs (length-normalised)."
    )
    partner_logprobs: Literal["auto", "always", "never"] = Field(
        "auto",
        description="Compute the policy's log-probs of every pair before the update so a pair split across "
        "data-parallel ranks or micro-batches still gets an exact gradient. auto: only when the policy has "
        "more than one rank or a mini-batch exceeds roles.policy.options.max_tokens_per_micro_batch.",
    )
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per step's batch (split between whole pairs).")
    epochs: int = Field(1, ge=1, description="Passes over each step's batch.")
    # evaluation
    eval_max_new_tokens: int = Field(32, ge=1, description="Longest response at evaluation.")
    eval_threshold: float = Field(1.0, description="A held-out sample is correct when its reward is >= this.")

    @model_validator(mode="after")
    def _check_loss(self) -> "PreferenceLossConfig":
        if self.loss_type == "conservative" and self.label_smoothing <= 0:
            raise ValueError("loss_type 'conservative' needs label_smoothing > 0 (e.g. 0.1)")
        if self.loss_type in ("ipo", "hinge") and self.label_smoothing > 0:
            raise ValueError(f"label_smoothing applies to sigmoid/conservative losses, not {self.loss_type!r}")
        return self


class DPOConfig(PreferenceLossConfig):
    name: Literal["dpo"] = Field("dpo", description="Algorithm name.")
    reference_mode: Literal["precompute", "live"] = Field(
        "precompute",
        description="precompute: reference log-probs of the whole training set are computed once by the policy "
        "before its first update (cached per record id in the run directory, no reference role); live: a "
        "'reference' role scores each batch.",
    )
    max_prompt_tokens: int = Field(512, ge=1, description="Prompts longer than this are cut on the left.")
    max_response_tokens: int = Field(512, ge=1, description="Chosen/rejected responses longer than this are cut.")
    eval_with: Literal["local", "rollout"] = Field(
        "local",
        description="local: save the policy in HF format and decode in the controller process; rollout: sync the "
        "policy into a 'rollout' role and generate there.",
    )


class OnlineDPOConfig(PreferenceLossConfig, SamplingConfig, MultiTurnKeys):
    """The preference loss keys, the shared sampling keys
    (:class:`~rlweave.algo_helpers.sampling.SamplingConfig`) and OnlineDPO's own."""

    name: Literal["online_dpo"] = Field("online_dpo", description="Algorithm name.")
    n_samples: int = Field(4, ge=2, description="Responses sampled per prompt (k >= 2).")
    reward_source: Literal["rules", "model"] = Field(
        "rules", description="rules: the configured rewards[] (rule functions); model: a 'reward' role's scores."
    )
    min_reward_gap: float = Field(
        0.0, ge=0, description="A pair needs best - worst reward strictly above this; prompts below are counted as ties."
    )

    # what the step toolkit's reward sources read (rlweave.algo_helpers.reward_sources)
    @property
    def reward_models(self) -> list[RewardModelEntry]:
        """reward_source 'model': the 'reward' role's score; else none."""
        return [RewardModelEntry(role="reward")] if self.reward_source == "model" else []

    @property
    def rule_rewards(self) -> bool:
        """reward_source 'rules': the configured rewards score the samples (else they only judge
        held-out answers)."""
        return self.reward_source == "rules"


def _get(cfg: Any, key: str, default: Any) -> Any:
    return getattr(cfg, key, None) if hasattr(cfg, key) else dict(cfg).get(key, default)


def dpo_roles(cfg: Any) -> tuple[str, ...]:
    """DPO trains the policy; a 'reference' role only with reference_mode 'live'; a 'rollout'
    role only when evaluation generates there."""
    roles: tuple[str, ...] = ("policy",)
    if _get(cfg, "reference_mode", "precompute") == "live":
        roles += ("reference",)
    if _get(cfg, "eval_with", "local") == "rollout":
        roles += ("rollout",)
    return roles


def online_dpo_roles(cfg: Any) -> tuple[str, ...]:
    """OnlineDPO: policy, rollout, reference, and a 'reward' model role with reward_source 'model'."""
    roles: tuple[str, ...] = ("policy", "rollout", "reference")
    if _get(cfg, "reward_source", "rules") == "model":
        roles += ("reward",)
    return roles
