"""Rollout sampling keys shared by the configs of the algorithms that generate (GRPO, PPO,
OnlineDPO): one definition, flat beside ``algorithm.name`` in YAML.

An algorithm's config subclasses :class:`SamplingConfig`, redefines ``n_samples`` where its
default or bound differs, and turns the keys into engine settings with
:func:`rlweave.algo_helpers.rollout.sampling_params`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SamplingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_samples: int = Field(1, ge=1, description="Responses sampled per prompt.")
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature of the rollout; old, reference and training log-probs are those "
        "of logits / temperature (the distribution sampled from).",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold (1.0: off).")
    top_k: int = Field(-1, description="Top-k sampling (-1: off).")
    max_new_tokens: int = Field(64, ge=1, description="Longest response sampled during training.")
    eval_greedy: bool = Field(True, description="Greedy decoding at evaluation (else sample at temperature).")
