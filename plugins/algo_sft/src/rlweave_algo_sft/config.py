"""Settings of ``algorithm.name: sft`` (the keys beside ``name`` in the ``algorithm`` section)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Literal["sft"] = Field("sft", description="Algorithm name.")
    loss_agg: Literal["token_mean", "seq_mean"] = Field(
        "token_mean", description="Mean the loss over all response tokens of a batch, or per sample then over samples."
    )
    append_eos: bool = Field(True, description="Append the tokenizer's EOS to query/response answers (learn to stop).")
    max_length: int = Field(2048, ge=2, description="Drop (with a warning) samples longer than this many tokens.")
    train_on_prompt: bool = Field(False, description="Also train on prompt tokens (default: response tokens only).")
    eval_rollout: bool = Field(
        False, description="Evaluate through a 'rollout' role (started and synced from the policy); else greedy "
        "decoding of a saved copy of the policy in the controller."
    )
    eval_max_new_tokens: int = Field(32, ge=1, description="Longest answer generated at evaluation.")
    eval_threshold: float = Field(1.0, description="A held-out sample is correct when its reward is >= this.")


def sft_roles(cfg: SFTConfig) -> tuple[str, ...]:
    """Roles SFT needs: the policy; a rollout engine too when evaluating through one."""
    rollout = cfg.eval_rollout if isinstance(cfg, SFTConfig) else bool(dict(cfg).get("eval_rollout", False))
    return ("policy",) + (("rollout",) if rollout else ())
