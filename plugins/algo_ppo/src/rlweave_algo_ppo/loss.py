"""PPO's critic loss as a picklable loss function (run on the training ranks). The policy
trains with the shared :class:`~rlweave.algo_parts.objective.PolicyObjective` (named policy
loss, off-policy correction, entropy bonus and the InstructGPT ptx term).

It follows the token-weight convention of :mod:`rlweave.interfaces.backend`: the batch carries
a token field ``token_weight`` such that ``sum(token_weight * per_token_loss)`` over every
token of the mini-batch on every rank is the loss wanted; the backend sums micro-batches and
ranks. Metrics are weight-sums too, so the backend's sums are means.

**Critic** (:class:`ValueLoss`), with returns ``R`` and the values ``V_old`` seen when the
experience was made::

    V_clip = V_old + clip(V - V_old, -clip_eps, clip_eps)
    vf_t   = 0.5 * max((V - R)^2, (V_clip - R)^2)          (0.5 * (V - R)^2 without clipping)
    loss   = sum_t w_t * vf_t
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

VALUE_FIELDS = ("old_values", "returns", "token_weight")


def _require(batch: Any, fields: tuple[str, ...], who: str) -> None:
    missing = [k for k in fields if k not in batch.token]
    if missing:
        raise ValueError(f"{who}: batch lacks token field(s) {missing}")


def value_token_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_eps: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (clipped) value loss and a 0/1 float marking tokens where the clipped
    branch is larger."""
    unclipped = (values - returns) ** 2
    if clip_eps is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    v_clip = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    clipped = (v_clip - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float()


@dataclass(frozen=True)
class ValueLoss:
    """Clipped value loss for the critic (``clip_eps=None``: plain squared error).

    Batch: token ``old_values``, ``returns``, ``token_weight``. Metrics (weighted sums):
    ``value_loss``, ``value_clipfrac``, ``values`` (mean prediction)."""

    clip_eps: float | None = 0.2

    def __call__(self, outputs: Any, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        values = getattr(outputs, "values", None)
        if values is None:
            raise ValueError(
                "PPO value loss: the critic's backend returned no values (critic model_type must be 'value')"
            )
        zero = values.sum() * 0.0
        metrics = {"value_loss": 0.0, "value_clipfrac": 0.0, "values": 0.0}
        if values.numel() == 0:
            return zero, metrics
        _require(batch, VALUE_FIELDS, "PPO value loss")
        dev, dt = values.device, values.dtype
        w = batch.token["token_weight"].to(dev, dt)
        old = batch.token["old_values"].to(dev, dt)
        ret = batch.token["returns"].to(dev, dt)
        vf, clipped = value_token_loss(values, old, ret, self.clip_eps)
        loss = (w * vf).sum() + zero
        metrics["value_loss"] = float(loss.detach())
        metrics["value_clipfrac"] = float((w * clipped).sum())
        metrics["values"] = float((w * values.detach()).sum())
        return loss, metrics
