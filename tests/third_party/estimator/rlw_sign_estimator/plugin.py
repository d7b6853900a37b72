"""Registers ``sign_baseline`` through the ``rlweave_advantage_estimators`` hook (light: no torch)."""
from pydantic import BaseModel, ConfigDict, Field

from rlweave.plugins import AdvantageRecord, hookimpl


class SignOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scale: float = Field(1.0, gt=0, description="Magnitude of every advantage.")


@hookimpl
def rlweave_advantage_estimators():
    return [AdvantageRecord(name="sign_baseline", summary="scale * sign(R - group mean)",
                            target="rlw_sign_estimator.estimator:sign_baseline", config_model=SignOptions)]
