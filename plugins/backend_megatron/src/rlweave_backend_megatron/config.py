"""``roles.<role>.options`` of the ``megatron`` backend (pydantic, light: no torch, no megatron).

A worker reads them as ``ctx.options_as(MegatronConfig)``; :mod:`rlweave_backend_megatron.checks`
refuses the combinations the model or the parallel sizes do not allow.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class MegatronConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    transformer_impl: Literal["auto", "local", "transformer_engine"] = Field(
        "auto", description="Layer implementation of megatron-core: 'local' (plain torch layer specs), "
        "'transformer_engine' (NVIDIA Transformer Engine layers, CUDA only). auto: transformer_engine when it is "
        "importable and the rank's device is CUDA, else local.",
    )
    sequence_parallel: bool = Field(
        False, description="Megatron's sequence parallelism (activations outside attention and MLP split along the "
        "sequence over the tp ranks): not supported yet, validation refuses true.",
    )
    max_tokens_per_micro_batch: int = Field(
        4096, ge=1, description="Token budget of one training micro-batch, counted as the tokens of its padded rows "
        "(rows x longest row).",
    )
    max_tokens_per_forward: Optional[int] = Field(
        None, ge=1, description="Token budget of one no-grad forward (log-probs, values, scores), counted like "
        "max_tokens_per_micro_batch; null: 2x the training budget.",
    )
    activation_checkpointing: bool = Field(
        False, description="Megatron's full recompute: keep only each transformer layer's input in forward and "
        "recompute the layer in backward.",
    )
    seed: Optional[int] = Field(
        None, description="Seed of megatron's model-parallel random streams (head initialisation, dropout); "
        "null: the run seed.",
    )
    hf_shard_bytes: int = Field(
        2_000_000_000, ge=1, description="Max bytes per safetensors file when writing the model in Hugging Face "
        "format (save_hf).",
    )
    make_vocab_size_divisible_by: int = Field(
        128, ge=1, description="The embedding and output-layer rows are padded to a multiple of this times "
        "parallel.tp (megatron's vocabulary padding); the padding rows are dropped on export and weight sync.",
    )
