"""Options of the SGLang engine (``roles.rollout.options``); light, no sglang import.

The fields document what the engine will take. A run selecting ``sglang`` fails at
validation through the record's probe (see :mod:`rlweave_infer_sglang`), before these
options are read.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SGLangConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mem_fraction_static: float = Field(0.5, gt=0, le=1, description="Fraction of device memory for weights and KV cache.")
    max_running_requests: int = Field(256, ge=1, description="Concurrent requests per engine.")
    chunked_prefill_size: int = Field(4096, ge=1, description="Tokens per prefill chunk.")
