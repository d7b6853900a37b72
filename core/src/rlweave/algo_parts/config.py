"""Config pieces the RL algorithms share for their named parts (light: pydantic only).

``algorithm.advantage``, ``algorithm.policy_loss``, ``algorithm.loss_agg`` and
``algorithm.kl.estimator`` are :class:`~rlweave.algo_parts.spec.PartSpec` fields checked by
:func:`checked` (the name must resolve among the installed parts, the options must validate),
so a bad name is reported at its key path before any worker starts.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

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
    """``algorithm.kl``: the KL to the reference model, in the loss or in the reward."""

    model_config = ConfigDict(extra="forbid")

    beta: float = Field(0.0, ge=0, description="KL coefficient; 0 starts no reference role.")
    estimator: PartSpec = Field(PartSpec("k3"), description="Per-token KL estimator: k1, k2, k3 or a plugin's.")
    in_reward: bool = Field(
        False, description="Put -beta * KL into the reward (per token; summed per sample for sequence-level "
        "estimators) instead of a loss term."
    )
    clamp: Optional[float] = Field(10.0, gt=0, description="Clamp each token's KL estimate to [-clamp, clamp] "
                                   "(null: no clamp).")

    @field_validator("estimator")
    @classmethod
    def _estimator(cls, v: PartSpec) -> PartSpec:
        return checked("kl", v)

    @model_validator(mode="after")
    def _check(self) -> "KLSection":
        if self.in_reward and self.beta == 0:
            raise ValueError("kl.in_reward needs kl.beta > 0")
        return self
