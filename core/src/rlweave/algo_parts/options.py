"""Options of the built-in algorithm parts (light: pydantic only), validated when a config
names a part as a mapping (``algorithm.policy_loss: {name: gspo, clip_high: 4.0e-4}``)."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StdOptions(_Options):
    eps: float = Field(1e-6, gt=0, description="Added to the standard deviation before dividing.")


class ReinforcePPOptions(StdOptions):
    gamma: float = Field(1.0, ge=0, le=1, description="Discount of the per-token return-to-go.")


class GAEOptions(_Options):
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")


class PPOClipOptions(_Options):
    clip_low: float = Field(0.2, ge=0, description="Lower clip range: ratio >= 1 - clip_low.")
    clip_high: float = Field(0.2, ge=0, description="Upper clip range: ratio <= 1 + clip_high (DAPO: 0.28).")
    dual_clip: Optional[float] = Field(
        None, gt=1, description="Dual clip c: a negative-advantage token's loss is at most -A * c (null: off; "
        "verl's default is 3)."
    )


class GSPOOptions(_Options):
    clip_low: float = Field(3e-4, ge=0, description="Lower clip range of the sequence ratio.")
    clip_high: float = Field(4e-4, ge=0, description="Upper clip range of the sequence ratio.")


class CISPOOptions(_Options):
    clip_low: Optional[float] = Field(None, ge=0, le=1, description="Lower clip of the IS weight (null: none).")
    clip_high: float = Field(0.28, ge=0, description="Upper clip of the IS weight: w <= 1 + clip_high.")


class NormLenOptions(_Options):
    norm_len: Optional[int] = Field(
        None, ge=1, description="The constant length each sample's token sum is divided by (null: max_new_tokens)."
    )
