"""``roles.<role>.options`` of the ``megatron`` backend (pydantic, light: no torch, no megatron).

A worker reads them as ``ctx.options_as(MegatronConfig)``; :mod:`rlweave_backend_megatron.checks`
refuses the combinations the model or the parallel sizes do not allow.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator


class MegatronConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    transformer_impl: Literal["auto", "local", "transformer_engine"] = Field(
        "auto", description="Layer implementation of megatron-core: 'local' (plain torch layer specs), "
        "'transformer_engine' (NVIDIA Transformer Engine layers, CUDA only). auto: transformer_engine when it is "
        "importable and the rank's device is CUDA, else local.",
    )
    sequence_parallel: bool = Field(
        False, description="Megatron's sequence parallelism: activations outside attention and MLP (norms, residuals, "
        "dropout) split along the sequence over the tp ranks, gathered before and reduce-scattered after each "
        "tensor-parallel block. Needs parallel.tp > 1.",
    )
    use_packing: bool = Field(
        True, description="Micro-batches as one row of samples back to back, attention within each sample (THD, "
        "no padding); false: right-padded rows with an attention mask.",
    )
    max_tokens_per_micro_batch: int = Field(
        4096, ge=1, description="Token budget of one training micro-batch: its tokens when packed, the tokens of its "
        "padded rows (rows x longest row) otherwise.",
    )
    max_tokens_per_forward: Optional[int] = Field(
        None, ge=1, description="Token budget of one no-grad forward (log-probs, values, scores), counted like "
        "max_tokens_per_micro_batch; null: 2x the training budget.",
    )
    pipeline_schedule: str = Field(
        "1f1b", description="Order of the micro-batches' forward and backward passes over pipeline stages (pp > 1): "
        "'1f1b' (warm-up forwards, then one forward one backward: stages work at the same time) or 'sequential' "
        "(one micro-batch through every stage at a time). Both give the same gradients.",
    )
    master_weights: bool = Field(
        True, description="With model.dtype bfloat16 or float16: the optimizer updates fp32 master copies of the "
        "parameters with fp32 state, gradients summed in fp32, and the parameters take the rounded masters after each "
        "step; false: the optimizer updates the low-precision parameters and keeps low-precision state. No effect in "
        "float32.",
    )
    shard_optimizer: bool = Field(
        True, description="With data-parallel replicas (dp > 1): each parameter's AdamW state lives on one "
        "data-parallel rank, which sums its gradient, steps it and broadcasts it (ZeRO stage 1; about 1/dp of the state "
        "per rank, the same updates); false: every replica keeps the whole state and steps every parameter.",
    )
    dp_bucket_bytes: int = Field(
        50_000_000, ge=1, description="Bytes per bucket of the data-parallel gradient sums and the sharded optimizer's "
        "parameter broadcasts (consecutive tensors of one dtype flattened into one collective call).",
    )
    moe_aux_loss_coef: Optional[float] = Field(
        None, ge=0, description="Mixture-of-experts models: coefficient of the router load-balancing loss (Switch "
        "Transformer, as transformers computes it) added to each micro-batch's loss, weighted by its share of the "
        "step's tokens; null: the model config's router_aux_loss_coef; 0 turns it off. Dense models ignore it.",
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

    @field_validator("pipeline_schedule")
    @classmethod
    def _known_schedule(cls, v: str) -> str:
        from rlweave_backend_megatron.schedules import SCHEDULES

        if v not in SCHEDULES:
            raise ValueError(f"unknown pipeline schedule {v!r} (choose from {sorted(SCHEDULES)})")
        return v
