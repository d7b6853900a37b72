"""``roles.<role>.options`` of the ``fsdp`` backend (pydantic, light: no torch)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field
from rlweave.backend_helpers.hf_model.options import CPUOptions


class FSDPConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mixed_precision: Literal["none", "bf16"] = Field(
        "none", description="bf16: compute in bf16 with fp32 master weights and fp32 gradient reduction. On a CPU "
        "without fast bf16 matmuls (e.g. AVX2 only) a warning names this CPU's probed slowdown; use none there.",
    )
    activation_checkpointing: bool = Field(False, description="Recompute decoder-layer activations in backward.")
    freeze_vision_tower: bool = Field(
        False, description="Vision-language models: do not train the vision tower; its parameters stay out of the "
        "optimizer, the checkpoints and the weight sync (the rollout engine keeps the tower it loaded).",
    )
    max_tokens_per_micro_batch: int = Field(
        4096, ge=1, description="Token budget of one packed micro-batch (a longer sample gets its own). With "
        "parallel.sp = N it is the budget of the whole sequence-parallel group: each of its N ranks holds about 1/N "
        "of the micro-batch's tokens.",
    )
    max_tokens_per_forward: Optional[int] = Field(
        None, description="Token budget of no-grad forwards (log-probs, values, scores), per sequence-parallel group "
        "like max_tokens_per_micro_batch; null: 2x the training budget."
    )
    use_packing: bool = Field(
        True, description="Pack micro-batch samples into one row with varlen attention (false: right-padded rows; "
        "not with parallel.sp)."
    )
    share_prompts: bool = Field(
        True, description="Packed rows carry a prompt once for all samples of a micro-batch that share it (GRPO groups, "
        "DPO pairs); needs rlweave's varlen attention. Exact; fewer tokens through the model.",
    )
    attn_implementation: Literal["auto", "varlen", "flash_attention_2", "sdpa"] = Field(
        "auto",
        description="auto: flash_attention_2 if installed on GPU, else rlweave's exact varlen attention (per-sample SDPA "
        "or torch varlen_attn).",
    )
    compile: bool = Field(
        False, description="torch.compile parts of each decoder layer (see compile_scope; attention stays eager): fused "
        "elementwise work and fewer kernel launches; the first steps compile (tens of seconds). On CPU it also compiles "
        "the log-prob/entropy gradient, rotary embeddings (with cpu.kernels) and the attention backward "
        "(cpu.attention_backward).",
    )
    compile_scope: Literal["auto", "layer", "mlp_norms"] = Field(
        "auto", description="With compile: 'layer' compiles each decoder layer whole (rotary and projections included); "
        "'mlp_norms' compiles only the layer's other children (its norms and MLP). auto: layer on GPU, mlp_norms on CPU, "
        "where inductor's rotary backward is slow (bench/RESULTS.md).",
    )
    cpu: CPUOptions = Field(
        default_factory=CPUOptions, description="CPU fast paths (used on CPU ranks only; see its keys).")
    reshard_after_forward: Optional[bool] = Field(
        None, description="FSDP2: free gathered parameters after each forward (ZeRO-3); null: only with 2+ ranks."
    )
    seed: Optional[int] = Field(None, description="Seed of head initialisation and dropout (null: the run seed).")
    moe_aux_loss_coef: Optional[float] = Field(
        None, ge=0, description="Mixture-of-experts models: coefficient of the router load-balancing loss (Switch "
        "Transformer, as transformers computes it) added to each micro-batch's loss, weighted by its share of the "
        "step's tokens; null: the model config's router_aux_loss_coef; 0 turns it off. Dense models ignore it.",
    )
    hf_shard_bytes: int = Field(2 << 30, ge=1 << 20, description="Max bytes per safetensors file in save_hf.")
