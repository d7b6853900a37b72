"""Options of the megatron backend (``roles.<role>.options``); light, no megatron import.

The fields document what the backend will take; validating any options section raises
the "not implemented yet" error so a run selecting ``megatron`` fails at validation.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlweave_backend_megatron import NOT_IMPLEMENTED


class MegatronConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    transformer_impl: Literal["local", "transformer_engine"] = Field(
        "transformer_engine", description="megatron-core transformer layer implementation.")
    sequence_parallel: bool = Field(False, description="Shard activations along the sequence with TP.")
    use_distributed_optimizer: bool = Field(True, description="Shard optimizer state across data-parallel ranks.")
    micro_batch_size: int = Field(1, ge=1, description="Sequences per micro-batch (pipeline schedule).")

    @model_validator(mode="after")
    def _not_implemented(self) -> "MegatronConfig":
        raise ValueError(NOT_IMPLEMENTED)
