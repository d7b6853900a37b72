"""``roles.<role>.options`` of the ``deepspeed`` backend (pydantic, light: no torch)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from rlweave.backend_helpers.hf_model.options import CPUOptions


class DeepSpeedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    zero_stage: Literal[1, 2, 3] = Field(
        2, description="ZeRO stage: 1 shards the optimizer state over parallel.dp ranks, 2 also the gradients, 3 also "
        "the parameters (gathered layer by layer for each forward and backward).",
    )
    offload_optimizer: Literal["none", "cpu"] = Field(
        "none", description="cpu: the fp32 master weights, gradients and AdamW state live in host memory and the "
        "optimizer step runs there (ZeRO-Offload).",
    )
    offload_param: Literal["none", "cpu"] = Field(
        "none", description="cpu (zero_stage 3 only): parameter shards live in host memory between uses (ZeRO-Infinity "
        "to CPU).",
    )
    mixed_precision: Literal["none", "bf16"] = Field(
        "none", description="bf16: bf16 parameters and compute with fp32 master weights and fp32 optimizer state in the "
        "ZeRO optimizer. On a CPU without fast bf16 matmuls (e.g. AVX2 only) use none.",
    )
    activation_checkpointing: bool = Field(False, description="Recompute decoder-layer activations in backward.")
    freeze_vision_tower: bool = Field(
        False, description="Vision-language models: do not train the vision tower; its parameters stay out of the "
        "optimizer, the checkpoints and the weight sync (the rollout engine keeps the tower it loaded).",
    )
    max_tokens_per_micro_batch: int = Field(4096, ge=1, description="Token budget of one packed training micro-batch "
                                            "(a longer sample gets its own).")
    max_tokens_per_forward: int | None = Field(
        None, ge=1, description="Token budget of no-grad forwards (log-probs, values, scores); null: 2x the training budget.")
    use_packing: bool = Field(True, description="Pack micro-batch samples into one row with varlen attention (false: "
                              "right-padded rows).")
    share_prompts: bool = Field(
        True, description="Packed rows carry a prompt once for all samples of a micro-batch that share it (GRPO groups, "
        "DPO pairs); needs rlweave's varlen attention. Exact; fewer tokens through the model.",
    )
    attn_implementation: Literal["auto", "varlen", "flash_attention_2", "sdpa"] = Field(
        "auto", description="auto: flash_attention_2 if installed on GPU, else rlweave's exact varlen attention.")
    cpu: CPUOptions = Field(default_factory=CPUOptions,
                            description="CPU fast paths of the HF model layer, as the fsdp backend's (CPU ranks only).")
    seed: int | None = Field(None, description="Seed of head initialisation and dropout (null: the run seed).")
    hf_shard_bytes: int = Field(2 << 30, ge=1 << 20, description="Max bytes per safetensors file in save_hf.")
    checkpoint_shard_bytes: int = Field(
        1 << 30, ge=1 << 20, description="Max bytes per safetensors file of a checkpoint's full fp32 weights and "
        "optimizer state (rank 0 writes them one file at a time).",
    )
    ds_config: dict[str, Any] = Field(
        default_factory=dict, description="DeepSpeed config keys merged into the one the backend builds (for example "
        "zero_optimization.reduce_bucket_size, zero_optimization.overlap_comm, communication_data_type). Keys the "
        "backend sets from rlweave's own settings (ZeRO stage, offload, precision, clipping, batch sizes, optimizer, "
        "scheduler) are refused with the setting to use instead.",
    )
