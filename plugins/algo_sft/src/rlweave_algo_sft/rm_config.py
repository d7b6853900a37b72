"""Settings of ``algorithm.name: rm`` (reward-model training; light: pydantic only)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class RMConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Literal["rm"] = Field("rm", description="Algorithm name.")
    margin: Literal["none", "record", "scores"] = Field(
        "none",
        description="Bradley-Terry margin: none; a pairwise record's 'margin' field; or, in addition, the score "
        "difference of ranked pairs.",
    )
    margin_scale: float = Field(1.0, ge=0, description="Multiplier of the margin.")
    append_eos: bool = Field(True, description="Close every response with EOS (the score is read at the last token).")
    max_length: int = Field(2048, ge=2, description="Drop (with a warning) pairs with a sequence longer than this.")
    extra_data: Optional[str] = Field(
        None, description="A second preference jsonl (e.g. ranked records) mixed into every step."
    )
    extra_batch_size: int = Field(4, ge=1, description="Records drawn from extra_data per step.")
    eval_max_pairs: Optional[int] = Field(None, ge=1, description="Evaluate on at most this many held-out pairs.")


def rm_roles(cfg: RMConfig) -> tuple[str, ...]:
    """The only role: ``policy``, a scalar-head model (``model_type: reward``)."""
    return ("policy",)
