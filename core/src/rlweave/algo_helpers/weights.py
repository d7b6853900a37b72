"""Per-token loss weights implementing the token-weight convention of
:mod:`rlweave.interfaces.backend`: ``sum(w * per_token_loss)`` over the whole (mini-)batch
is the wanted mean, and backends only ever sum.

* ``token_mean``: every response token of the batch counts the same (DAPO):
  ``w = mask / sum(mask)``.
* ``seq_mean``: mean over tokens inside each sample, then mean over samples (original
  GRPO): ``w = mask / (len_i * n_samples)``; samples with no trained token are not counted.
"""

from __future__ import annotations

import torch

from rlweave.data.batch import Batch

AGGREGATIONS = ("token_mean", "seq_mean")


def token_weights(batch: Batch, mode: str = "token_mean", mask_key: str = "loss_mask") -> torch.Tensor:
    """Float ``(T,)`` weights, 0 off the mask. An all-zero mask gives all-zero weights."""
    mask = batch.token[mask_key].float()
    if mode == "token_mean":
        total = mask.sum()
        return mask / total if total > 0 else torch.zeros_like(mask)
    if mode == "seq_mean":
        idx = batch.sample_index()
        per_seq = torch.zeros(len(batch), dtype=mask.dtype).index_add_(0, idx, mask)
        n_valid = int((per_seq > 0).sum())
        if n_valid == 0:
            return torch.zeros_like(mask)
        denom = (per_seq.clamp(min=1.0) * n_valid)[idx]
        return mask / denom
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}")
