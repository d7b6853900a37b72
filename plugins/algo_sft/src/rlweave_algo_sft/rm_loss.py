"""Bradley-Terry loss for reward models, and the form in which it is trained.

For a pair with scalar scores ``s_c`` (chosen) and ``s_r`` (rejected) and margin ``m``
(0 unless given; Llama-2's margin loss)::

    loss = -log sigmoid(s_c - s_r - m)

**Why the trained form is linearised.** The loss couples the two members of a pair, but
the backend forms micro-batches by token budget and the scheduler scatters samples to
data-parallel ranks by length, so a pair's members may land in different micro-batches or
ranks. The step therefore runs in two passes over the same parameters:

1. scores of every *unique* sequence, without gradient (``handle.scores``);
2. on the controller, the exact BT loss and its gradient ``g_i = dL/ds_i`` w.r.t. each score
   (:func:`bt_loss_and_grads`); then one ``train`` call with :class:`ScoreGradLoss`, whose
   per-sample loss ``g_i * s_i(theta)`` has, summed over all samples, exactly the gradient
   ``dL/dtheta = sum_i g_i ds_i/dtheta`` (the chain rule at the current parameters).

This is exact for any partitioning, scores each distinct response once even when ranked
data puts it in many pairs, and costs one extra forward pass. The backend's reported
``loss`` is the surrogate's value; the true loss and accuracy come from step 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Element-wise ``-log sigmoid(chosen - rejected - margin)``."""
    d = chosen - rejected
    if margin is not None:
        d = d - margin
    return -F.logsigmoid(d)


def bt_loss_and_grads(
    scores: torch.Tensor,
    chosen_idx: torch.Tensor,
    rejected_idx: torch.Tensor,
    margins: torch.Tensor | None = None,
    pair_weights: torch.Tensor | None = None,
) -> tuple[float, torch.Tensor, float]:
    """``(loss, grads, accuracy)`` for pairs indexing into ``scores`` ``(n,)``.

    ``loss = sum_p w_p * BT(s[c_p], s[r_p], m_p)`` with ``w_p = 1/P`` by default;
    ``grads`` ``(n,)`` is ``dloss/dscores``; ``accuracy`` is the weighted share of pairs
    with ``s_c > s_r`` (strictly)."""
    P = int(chosen_idx.numel())
    if P == 0:
        return 0.0, torch.zeros_like(scores, dtype=torch.float32), 0.0
    s = scores.detach().double().clone().requires_grad_(True)
    w = pair_weights.double() if pair_weights is not None else torch.full((P,), 1.0 / P, dtype=torch.float64)
    m = margins.double() if margins is not None else None
    loss = (w * bradley_terry_loss(s[chosen_idx], s[rejected_idx], m)).sum()
    loss.backward()
    correct = (s.detach()[chosen_idx] > s.detach()[rejected_idx]).double()
    return float(loss.detach()), s.grad.float(), float((w * correct).sum())


def live_scores(outputs: Any, batch: Any) -> torch.Tensor:
    """Per-sample scores ``(n,)`` with gradient, from a reward model's forward outputs on a
    *training* batch built by :func:`with_score_slot`.

    Values follow the prediction convention (``values[t]`` is the head read on the state
    before token ``t``), so on a sequence extended by one slot token the value at the last
    position is the head read after the real sequence's last token: exactly what
    ``compute_scores`` returns for the unextended sequence (causal attention: the slot
    cannot change earlier positions)."""
    values = getattr(outputs, "values", None)
    if values is None:
        raise ValueError(
            "reward-model loss: the backend returned no values (roles.policy.model.model_type must be 'reward')"
        )
    last = (batch.cu_seqlens[1:] - 1).to(values.device)
    return values[last]


def with_score_slot(sequences: list[list[int]], slot_token: int) -> list[list[int]]:
    """Each sequence followed by one ``slot_token`` (see :func:`live_scores`)."""
    return [list(s) + [int(slot_token)] for s in sequences]


@dataclass(frozen=True)
class ScoreGradLoss:
    """Picklable loss ``sum_i score_grad_i * s_i(theta)`` (see module docstring).

    Batch: sequences extended by :func:`with_score_slot`; sample ``score_grad`` (float,
    ``dL/ds_i`` from :func:`bt_loss_and_grads`); optional sample ``score_weight`` (``1/n``)
    for the ``score_mean`` metric."""

    needs_entropy = False  # read by backends: no entropy needed

    def __call__(self, outputs: Any, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        if len(batch) == 0:
            return outputs.values.sum() * 0.0, {"score_mean": 0.0}
        if "score_grad" not in batch.sample:
            raise ValueError("reward-model loss: batch lacks sample field 'score_grad'")
        s = live_scores(outputs, batch)
        g = batch.sample["score_grad"].to(s.device, s.dtype)
        metrics = {}
        if "score_weight" in batch.sample:
            metrics["score_mean"] = float((batch.sample["score_weight"].to(s.device, s.dtype) * s.detach()).sum())
        return (g * s).sum(), metrics
