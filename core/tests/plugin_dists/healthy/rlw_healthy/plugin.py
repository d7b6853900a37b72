"""A healthy test plugin: a backend with options, an algorithm and a reward."""
from pydantic import BaseModel, ConfigDict, Field

from rlweave.plugins import AlgorithmRecord, BackendRecord, RewardRecord, hookimpl


class ToyBackendConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    chunk: int = Field(1, ge=1, description="Chunk size.")


class ToyAlgoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(4, ge=2, description="Samples per prompt.")


@hookimpl
def rlweave_training_backends():
    return [BackendRecord(name="toyback", summary="toy backend", target="rlw_healthy.plugin:ToyBackendConfig",
                          config_model=ToyBackendConfig, parallel=("dp",))]


@hookimpl
def rlweave_algorithms():
    return [AlgorithmRecord(name="toyalgo", summary="toy algorithm", target="rlw_healthy.plugin:ToyAlgoConfig",
                            config_model=ToyAlgoConfig, roles=lambda cfg: ("policy",))]


@hookimpl
def rlweave_rewards():
    return [RewardRecord(name="toyreward", summary="toy reward", target="rlw_healthy.plugin:ToyAlgoConfig")]
