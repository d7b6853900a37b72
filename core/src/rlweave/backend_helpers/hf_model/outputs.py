"""Turning raw model outputs of a packed micro-batch into per-token quantities under the
prediction convention of :mod:`rlweave.data.batch` (``x[t]`` belongs to predicting token
``t``; 0 at each sample's first token).

With ``rows`` (a shared-prompt row, :mod:`.prefix`), the raw outputs are per row position and
``rows[t]`` is the row position of original token ``t``; the results are still per original
token (a prompt's last position predicts the first response token of every sample sharing it).

With ``window`` (a backend's sequence parallelism, e.g. the FSDP backend's), the raw outputs are those
of row positions ``[window.lo, window.lo + window.n)`` only: each token whose predicting
position lies there is computed here, the others are zero, and ``window.combine`` (the sum
over the sequence-parallel group) completes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from rlweave.backend_helpers.hf_model.logprob import selected_logprobs


@dataclass
class Outputs:
    """Implements :class:`rlweave.interfaces.backend.ModelOutputs` for one micro-batch."""

    logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None
    routing: torch.Tensor | None = None  # MoE: the experts each token was routed to, when recorded


@dataclass(frozen=True)
class Window:
    """The row positions ``[lo, lo + n)`` whose raw outputs this rank holds, and the
    differentiable sum over the ranks holding the rest."""

    lo: int
    n: int
    combine: Callable[[torch.Tensor], torch.Tensor]

    def local(self, positions: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        """Indices ``i`` with ``positions[i]`` in the window (and not ``skip[i]``)."""
        inside = (positions >= self.lo) & (positions < self.lo + self.n)
        if skip is not None:
            inside &= ~skip
        return inside.nonzero().squeeze(1)

    def spread(self, idx: torch.Tensor, values: torch.Tensor, total: int) -> torch.Tensor:
        """``values`` (for ``idx``) in a zero ``(total,)`` float32 tensor, summed over the group."""
        out = torch.zeros(total, dtype=torch.float32, device=values.device)
        return self.combine(out.index_copy(0, idx, values.float()))


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
    rows: torch.Tensor | None = None, compiled: bool = False, window: Window | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits`` ``(T, V)`` (position t predicts t+1; ``(T', V)`` per row position with
    ``rows``; the window's positions with ``window``) -> log-prob and entropy ``(T,)`` float32
    of the original tokens ``input_ids``, computed in fp32 chunk by chunk, or by inductor
    kernels with ``compiled`` (:mod:`.logprob`)."""
    total = input_ids.numel()
    first = first_token_mask(cu_seqlens, total, logits.device)
    pred = _predictors(rows, first)
    targets = input_ids.to(logits.device)
    if window is None:
        lp, ent = selected_logprobs(logits, pred, targets, temperature, with_entropy, compiled=compiled)
    else:
        idx = window.local(pred, first)
        lp, ent = selected_logprobs(logits, pred[idx] - window.lo, targets[idx], temperature, with_entropy,
                                    compiled=compiled)
        lp = window.spread(idx, lp, total)
        ent = window.spread(idx, ent, total) if ent is not None else None
    lp = lp.masked_fill(first, 0.0)
    return lp, (ent.masked_fill(first, 0.0) if ent is not None else None)


def token_values(raw: torch.Tensor, cu_seqlens: torch.Tensor, rows: torch.Tensor | None = None,
                 window: Window | None = None) -> torch.Tensor:
    """Head output at each position ``(T,)`` (per row position with ``rows``; the window's
    positions with ``window``) -> prediction-aligned values: ``values[t]`` is the value of the
    state before token ``t`` (the head read at ``t-1``); 0 at first tokens."""
    n = int(cu_seqlens[-1]) if rows is None else rows.numel()
    first = first_token_mask(cu_seqlens, n, raw.device)
    pred = _predictors(rows, first)
    if window is None:
        return raw.float()[pred].masked_fill(first, 0.0)
    idx = window.local(pred, first)
    return window.spread(idx, raw[pred[idx] - window.lo], n).masked_fill(first, 0.0)


def last_token_scores(raw: torch.Tensor, cu_seqlens: torch.Tensor, rows: torch.Tensor | None = None,
                      window: Window | None = None) -> torch.Tensor:
    """Head output at each sample's last token ``(n,)`` (``window``: as in :func:`token_values`)."""
    last = (cu_seqlens[1:] - 1).to(raw.device)
    pos = last if rows is None else rows.to(raw.device)[last]
    if window is None:
        return raw.float()[pos]
    idx = window.local(pos)
    return window.spread(idx, raw[pos[idx] - window.lo], pos.numel())
