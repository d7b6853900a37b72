"""Options of the megatron backend (``roles.<role>.options``); light, no megatron import.

The fields document what the backend will take. A run selecting ``megatron`` fails at
validation through the record's probe (see :mod:`rlweave_backend_megatron`), before these
options are read.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class MegatronConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    transformer_impl: Literal["local", "transformer_engine"] = Field(
        "transformer_engine", description="megatron-core transformer layer implementation.")
    sequence_parallel: bool = Field(False, description="Shard activations along the sequence with TP.")
    use_distributed_optimizer: bool = Field(True, description="Shard optimizer state across data-parallel ranks.")
    micro_batch_size: int = Field(1, ge=1, description="Sequences per micro-batch (pipeline schedule).")
