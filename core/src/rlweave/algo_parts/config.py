"""Config pieces the RL algorithms share for their named parts (light: pydantic only).

``algorithm.advantage``, ``algorithm.policy_loss``, ``algorithm.loss_agg`` and
``algorithm.kl.estimator`` are :class:`~rlweave.algo_parts.spec.PartSpec` fields checked by
:func:`checked` (the name must resolve among the installed parts, the options must validate),
so a bad name is reported at its key path before any worker starts.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlweave.algo_parts.spec import PartSpec, resolve


def checked(kind: str, spec: Any) -> Any:
    """``spec`` unchanged when it resolves as a part of ``kind``; else ``ValueError`` (pydantic
    reports it at the field's path)."""
    if spec is not None:
        resolve(kind, spec)
    return spec


def refuse_moved(data: Any, moved: Mapping[str, str]) -> Any:
    """Raise ``ValueError`` naming each key of ``data`` that ``moved`` lists (old key -> where
    its setting lives now); ``data`` unchanged otherwise."""
    if isinstance(data, Mapping):
        found = [k for k in moved if k in data]
        if found:
            raise ValueError("; ".join(f"'{k}' is no longer a key of algorithm: {moved[k]}" for k in found))
    return data


class KLSection(BaseModel):
    """``algorithm.kl`` of GRPO and PPO: the KL to the reference model, in the loss or in the
    reward, with a fixed or adaptive coefficient (:mod:`rlweave.algo_parts.kl_controller`).
    Algorithms whose defaults differ subclass it (PPO: in the reward, k1, beta 0.05)."""

    model_config = ConfigDict(extra="forbid")

    beta: float = Field(0.0, ge=0, description="KL coefficient (the initial one with target); 0 without target "
                        "starts no reference role.")
    estimator: PartSpec = Field(PartSpec("k3"), description="Per-token KL estimator: k1, k2, k3 or a plugin's.")
    in_reward: bool = Field(
        False, description="Put -beta * KL into the reward (per token; summed per sample for sequence-level "
        "estimators) instead of a loss term."
    )
    clamp: Optional[float] = Field(10.0, gt=0, description="Clamp each token's KL estimate to [-clamp, clamp] "
                                   "(null: no clamp).")
    target: Optional[float] = Field(
        None, gt=0, description="Adaptive coefficient (Ziegler et al. 2019): steer the mean summed KL per sample "
        "toward this value (needs in_reward); null: fixed beta.")
    horizon: float = Field(10000.0, gt=0, description="Adaptive coefficient's horizon, in samples.")

    @field_validator("estimator")
    @classmethod
    def _estimator(cls, v: PartSpec) -> PartSpec:
        return checked("kl", v)

    @model_validator(mode="after")
    def _check(self) -> "KLSection":
        if self.in_reward and self.beta == 0 and not type(self).model_fields["in_reward"].default:
            raise ValueError("kl.in_reward needs kl.beta > 0")  # asked for a reward penalty of 0
        if self.target is not None and not self.in_reward:
            raise ValueError("kl.target (adaptive coefficient) needs kl.in_reward: true (it steers the KL in the reward)")
        if self.target is not None and self.beta == 0:
            raise ValueError("kl.target needs an initial kl.beta > 0 (an adaptive coefficient of 0 stays 0)")
        return self

    @property
    def enabled(self) -> bool:
        """Whether there is a KL term at all (and so a reference model)."""
        return self.beta > 0


class PolicyParts(BaseModel):
    """The named parts of a policy-gradient algorithm's update, for its config to inherit:
    ``policy_loss`` and ``loss_agg``, both checked, and the refusal of keys listed in
    ``moved_keys`` (old key -> where its setting lives now; also the strict key check's hint)."""

    model_config = ConfigDict(extra="forbid")
    moved_keys: ClassVar[dict[str, str]] = {
        "clip_low": "use policy_loss: {name: ppo_clip, clip_low: ..., clip_high: ...}",
        "clip_high": "use policy_loss: {name: ppo_clip, clip_low: ..., clip_high: ...}",
    }

    policy_loss: PartSpec = Field(
        PartSpec("ppo_clip"), description="Policy loss: ppo_clip (options clip_low, clip_high, dual_clip), gspo, "
        "cispo, a plugin's, or module:function."
    )
    loss_agg: Optional[PartSpec] = Field(
        None, description="Loss aggregation: token_mean, seq_mean_token_mean, seq_mean_token_sum, "
        "seq_mean_token_sum_norm, token_sum (null: the policy loss's own, else the estimator's, else token_mean)."
    )

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        return refuse_moved(data, cls.moved_keys)

    @field_validator("policy_loss")
    @classmethod
    def _policy_loss(cls, v: PartSpec) -> PartSpec:
        return checked("policy_loss", v)

    @field_validator("loss_agg")
    @classmethod
    def _loss_agg(cls, v: Optional[PartSpec]) -> Optional[PartSpec]:
        return checked("loss_agg", v)
