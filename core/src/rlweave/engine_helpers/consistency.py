"""Train/rollout consistency: how far the engine's log-probs are from the trainer's.

After a weight update the rollout engine and the training backend hold the same weights,
so the log-prob the engine reported for each sampled token should equal the one the
backend recomputes on the same tokens (``compute_logprobs(batch, temperature=T)``, with
``T`` the sampling temperature). Differences come from kernels, dtypes, a stale weight sync
or a mismatched temperature; algorithms log this metric every step so a drift is visible.
"""

from __future__ import annotations

from typing import Any


def logprob_gap(engine_logprobs: Any, train_logprobs: Any, mask: Any = None) -> dict[str, float]:
    """Mean and max absolute difference between two per-token log-prob vectors.

    Args:
        engine_logprobs: ``(T,)`` log-probs the engine reported (e.g. the batch's token field
            ``rollout_logprobs``); tensor or sequence of floats.
        train_logprobs: ``(T,)`` log-probs from the training backend on the same tokens.
        mask: optional ``(T,)`` float/bool; only positions where it is non-zero count
            (usually ``loss_mask``: the response tokens).

    Returns:
        ``{"mean_abs": float, "max_abs": float, "num_tokens": int}``; both gaps are 0.0 when
        no token is selected.

    Raises:
        ValueError: the inputs do not have the same number of elements, or contain NaN
            on selected positions.
    """
    import torch

    a = torch.as_tensor(engine_logprobs, dtype=torch.float64).reshape(-1)
    b = torch.as_tensor(train_logprobs, dtype=torch.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"logprob_gap: engine has {a.numel()} log-probs, trainer has {b.numel()}")
    if mask is None:
        sel = torch.ones_like(a, dtype=torch.bool)
    else:
        m = torch.as_tensor(mask).reshape(-1)
        if m.numel() != a.numel():
            raise ValueError(f"logprob_gap: mask has {m.numel()} entries, log-probs have {a.numel()}")
        sel = m != 0
    diff = (a[sel] - b[sel]).abs()
    if diff.numel() == 0:
        return {"mean_abs": 0.0, "max_abs": 0.0, "num_tokens": 0}
    if torch.isnan(diff).any():
        raise ValueError("logprob_gap: NaN log-prob on a selected token")
    return {"mean_abs": float(diff.mean()), "max_abs": float(diff.max()), "num_tokens": int(diff.numel())}
