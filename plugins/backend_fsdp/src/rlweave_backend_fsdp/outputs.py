"""Turning raw model outputs of a packed micro-batch into per-token quantities under the
prediction convention of :mod:`rlweave.data.batch` (``x[t]`` belongs to predicting token
``t``; 0 at each sample's first token).

With ``rows`` (a shared-prompt row, :mod:`.prefix`), the raw outputs are per row position and
``rows[t]`` is the row position of original token ``t``; the results are still per original
token (a prompt's last position predicts the first response token of every sample sharing it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlweave_backend_fsdp.logprob import selected_logprobs


@dataclass
class Outputs:
    """Implements :class:`rlweave.interfaces.backend.ModelOutputs` for one micro-batch."""

    logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


def first_token_mask(cu_seqlens: torch.Tensor, total: int, device) -> torch.Tensor:
    m = torch.zeros(total, dtype=torch.bool, device=device)
    m[cu_seqlens[:-1].to(device)] = True
    return m


def _predictors(rows: torch.Tensor | None, first: torch.Tensor) -> torch.Tensor:
    """Position of the raw output that predicts each original token: ``rows[t-1]`` (``t-1``
    without ``rows``); any valid position at first tokens, which are masked."""
    if rows is None:
        rows = torch.arange(first.numel(), device=first.device)
    rows = rows.to(first.device)
    return torch.cat([rows[:1], rows[:-1]]).masked_fill(first, 0)


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, temperature: float, with_entropy: bool,
    rows: torch.Tensor | None = None, compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits`` ``(T, V)`` (position t predicts t+1; ``(T', V)`` per row position with
    ``rows``) -> log-prob and entropy ``(T,)`` float32 of the original tokens ``input_ids``,
    computed in fp32 chunk by chunk, or by inductor kernels with ``compiled`` (:mod:`.logprob`)."""
    first = first_token_mask(cu_seqlens, input_ids.numel(), logits.device)
    pred = _predictors(rows, first)
    lp, ent = selected_logprobs(logits, pred, input_ids.to(logits.device), temperature, with_entropy,
                                compiled=compiled)
    lp = lp.masked_fill(first, 0.0)
    return lp, (ent.masked_fill(first, 0.0) if ent is not None else None)


def token_values(raw: torch.Tensor, cu_seqlens: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Head output at each position ``(T,)`` (per row position with ``rows``) -> prediction-
    aligned values: ``values[t]`` is the value of the state before token ``t`` (the head read
    at ``t-1``); 0 at first tokens."""
    n = raw.numel() if rows is None else rows.numel()
    first = first_token_mask(cu_seqlens, n, raw.device)
    return raw.float()[_predictors(rows, first)].masked_fill(first, 0.0)


def last_token_scores(raw: torch.Tensor, cu_seqlens: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Head output at each sample's last token ``(n,)``."""
    last = (cu_seqlens[1:] - 1).to(raw.device)
    return raw.float()[last if rows is None else rows.to(raw.device)[last]]
