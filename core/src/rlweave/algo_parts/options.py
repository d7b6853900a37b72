"""Options of the built-in algorithm parts (light: pydantic only), validated when a config
names a part as a mapping (``algorithm.policy_loss: {name: gspo, clip_high: 4.0e-4}``)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


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


# ---------------------------------------------------------------- rollout corrections
class CapOptions(_Options):
    cap: float = Field(2.0, gt=0, description="Largest importance weight kept: larger ones are truncated to it.")


class BandOptions(_Options):
    """A ratio band ``[low, high]``: weights outside it are dropped (``low`` null: ``1 / high``)."""

    low: Optional[float] = Field(None, gt=0, description="Lower edge of the band (null: 1 / high).")
    high: float = Field(2.0, gt=0, description="Upper edge of the band.")

    @model_validator(mode="after")
    def _ordered(self) -> "BandOptions":
        low = 1.0 / self.high if self.low is None else self.low
        if not low < self.high:
            raise ValueError(f"low ({low:g}{'' if self.low is not None else ', 1 / high'}) must be smaller than "
                             f"high ({self.high:g})")
        return self


class IcePopOptions(BandOptions):
    low: Optional[float] = Field(0.5, gt=0, description="Lower edge of the band (IcePop: 0.5; null: 1 / high).")
    high: float = Field(5.0, gt=0, description="Upper edge of the band (IcePop: 5).")


class GeoMaskOptions(BandOptions):
    high: float = Field(1.001, gt=0, description="Upper edge of the band of a sample's geometric-mean weight.")
    token_weights: bool = Field(True, description="Kept samples carry their tokens' importance weights (false: 1, "
                                "pure rejection).")


class LegacyCorrectionOptions(_Options):
    """Options of ``tis`` and ``decoupled`` (also accepted beside ``correction`` in
    ``algorithm.off_policy``, as before)."""

    level: Literal["token", "sequence"] = Field("token", description="One weight per token, or one per sequence.")
    cap: float = Field(2.0, gt=0, description="Truncation point (tis) or drop threshold (decoupled).")
    floor: Optional[float] = Field(None, gt=0, description="Weights below this are dropped (null: off).")

    @model_validator(mode="after")
    def _floor_below_cap(self) -> "LegacyCorrectionOptions":
        if self.floor is not None and not self.floor < self.cap:
            raise ValueError(f"floor ({self.floor:g}) must be smaller than cap ({self.cap:g})")
        return self
