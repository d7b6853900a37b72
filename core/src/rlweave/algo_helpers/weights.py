"""Per-token loss weights of a batch, implementing the token-weight convention of
:mod:`rlweave.interfaces.backend`: ``sum(w * per_token_loss)`` over the whole (mini-)batch is
the wanted loss, and backends only ever sum. The weights come from a named loss aggregation
(:mod:`rlweave.algo_parts.aggregation`: ``token_mean``, ``seq_mean_token_mean``,
``seq_mean_token_sum``, ``seq_mean_token_sum_norm``, ``token_sum``, or a plugin's).
"""

from __future__ import annotations

import torch

from rlweave.algo_parts.spec import ResolvedPart, resolve
from rlweave.data.batch import Batch


def token_weights(batch: Batch, mode: "str | ResolvedPart" = "token_mean", mask_key: str = "loss_mask",
                  max_len: int | None = None) -> torch.Tensor:
    """Float ``(T,)`` weights, 0 off the mask; an all-zero mask gives all-zero weights.
    ``mode``: an aggregation's name or a resolved one; ``max_len``: the longest response the
    run samples (``seq_mean_token_sum_norm``)."""
    part = mode if isinstance(mode, ResolvedPart) else resolve("loss_agg", mode)
    return part.load()(batch.token[mask_key], batch.cu_seqlens, max_len=max_len, **part.options)
