"""Registers the ``hinted`` rollout through the ``rlweave_rollouts`` hook (light: no torch)."""
from pydantic import BaseModel, ConfigDict, Field

from rlweave.plugins import RolloutRecord, hookimpl


class HintArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hint: str = Field("", description="Text put before every prompt.")


@hookimpl
def rlweave_rollouts():
    return [RolloutRecord(name="hinted", summary="one continuation of the prompt after a fixed hint",
                          target="rlw_hint_rollout.rollout:HintedRollout", config_model=HintArgs)]
