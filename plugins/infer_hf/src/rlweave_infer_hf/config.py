"""Options of the ``hf`` engine (``roles.rollout.options``). Light: pydantic only."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class HFEngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_model_len: Optional[int] = Field(
        None, ge=2, description="Longest prompt + response; default: the model's max_position_embeddings."
    )
    long_prompt: Literal["error", "truncate"] = Field(
        "error", description="Prompts that do not fit: per-sample error, or keep their last tokens."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights dtype; auto: the role's model.dtype."
    )
    max_batch_size: int = Field(256, ge=1, description="Samples per generate() forward batch, at most.")
    max_batch_tokens: int = Field(
        16384, ge=1, description="Rows x (longest prompt + new tokens) of one forward batch, at most (its KV cache); "
        "a sample longer than this alone still gets a batch of its own.",
    )
    logprobs_mode: Literal["processed", "raw"] = Field(
        "processed",
        description="processed: log-probs of the distribution sampled from (temperature, top-k/top-p); "
        "raw: log_softmax of the unscaled logits.",
    )
    seed: Optional[int] = Field(None, description="Seed for calls without SamplingParams.seed; default: the run seed.")
