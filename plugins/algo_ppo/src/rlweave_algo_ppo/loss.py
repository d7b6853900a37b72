"""PPO losses as picklable loss functions (run on the training ranks).

Both follow the token-weight convention of :mod:`rlweave.interfaces.backend`: the batch
carries a token field ``token_weight`` such that ``sum(token_weight * per_token_loss)``
over every token of the mini-batch on every rank is the loss wanted (token mean or
sequence mean, see :func:`rlweave.algo_helpers.weights.token_weights`); the backend sums
micro-batches and ranks. Metrics are weight-sums too, so the backend's sums are means.

**Policy** (:class:`PolicyLoss`), with ``ratio = exp(logp - old_logp)`` and advantage ``A``::

    pg_t = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))
    loss = sum_t w_t * pg_t - entropy_coef * sum_t w_t * H_t + ptx_coef * sum_t p_t * (-logp_t)

With ``off_policy`` (``algorithm.off_policy``, :mod:`rlweave.algo_helpers.offpolicy`) each
``pg_t`` is multiplied by the stop-gradient behaviour factor ``c_t`` against the engine's
log-probs (truncated importance weight, or decoupled PPO's weight with tokens above the cap
dropped); ``old_logp`` is the proximal policy. Entropy and ptx terms are not corrected.

The last term is the optional pre-training ("ptx", InstructGPT) loss: supervised tokens
placed in the same mini-batch, marked by token field ``ptx_weight`` (weights summing to 1
over the ptx tokens of the mini-batch; ``token_weight`` and ``advantages`` are 0 there).

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

from rlweave.algo_helpers.offpolicy import OffPolicyConfig, policy_correction

POLICY_FIELDS = ("advantages", "old_logprobs", "token_weight")
VALUE_FIELDS = ("old_values", "returns", "token_weight")


def _require(batch: Any, fields: tuple[str, ...], who: str) -> None:
    missing = [k for k in fields if k not in batch.token]
    if missing:
        raise ValueError(f"{who}: batch lacks token field(s) {missing}")


def policy_token_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate ``pg_t``, a 0/1 float marking tokens where the clipped
    branch is active (the gradient is cut), and the ratio."""
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(unclipped, clipped)
    return pg, (clipped > unclipped).float(), ratio


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
class PolicyLoss:
    """Clipped PPO surrogate with optional entropy bonus and ptx term.

    Batch: token ``advantages``, ``old_logprobs``, ``token_weight``; ``ptx_weight`` when
    ``ptx_coef > 0``. Metrics (weighted sums): ``pg_loss``, ``clip_frac``, ``ppo_kl``
    (k3 estimate of KL(old || new)), ``ratio``, ``entropy`` (when the backend returns it),
    ``ptx_loss``, and ``offpolicy/*`` when ``off_policy`` corrects (token field
    ``rollout_logprobs`` needed then; None or ``correction: none``: no correction)."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    entropy_coef: float = 0.0
    ptx_coef: float = 0.0
    #: read by the backend: log-probs at the sampling temperature, entropy wanted or not
    temperature: float = 1.0
    with_entropy: bool = True
    off_policy: OffPolicyConfig | None = None

    def __post_init__(self) -> None:
        if self.entropy_coef > 0 and not self.with_entropy:
            raise ValueError("PPO policy loss: entropy_coef > 0 needs with_entropy=True")

    @property
    def needs_entropy(self) -> bool:
        """The name the fsdp backend reads (same as ``with_entropy``)."""
        return self.with_entropy

    def __call__(self, outputs: Any, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        logp = outputs.logprobs
        zero = logp.sum() * 0.0
        metrics = {"pg_loss": 0.0, "clip_frac": 0.0, "ppo_kl": 0.0, "ratio": 0.0, "ptx_loss": 0.0}
        if logp.numel() == 0:
            return zero, metrics
        _require(batch, POLICY_FIELDS, "PPO policy loss")
        dev = logp.device
        w = batch.token["token_weight"].to(dev, logp.dtype)
        old = batch.token["old_logprobs"].to(dev, logp.dtype)
        adv = batch.token["advantages"].to(dev, logp.dtype)
        pg, clipped, ratio = policy_token_loss(logp, old, adv, self.clip_low, self.clip_high)
        coef, off_metrics = policy_correction(self.off_policy, logp, batch)
        if coef is not None:
            pg = pg * coef
            metrics.update(off_metrics)
        loss = (w * pg).sum() + zero
        log_r = (old - logp.detach()).clamp(-20.0, 20.0)
        metrics["pg_loss"] = float((w * pg).sum().detach())
        metrics["clip_frac"] = float((w * clipped).sum())
        metrics["ppo_kl"] = float((w * (torch.exp(log_r) - log_r - 1.0)).sum())
        metrics["ratio"] = float((w * ratio.detach()).sum())
        ent = getattr(outputs, "entropy", None)
        if ent is not None:
            metrics["entropy"] = float((w * ent.detach()).sum())
        if self.entropy_coef > 0:
            if ent is None:
                raise ValueError("PPO policy loss: entropy_coef > 0 but the backend returned no entropy")
            loss = loss - self.entropy_coef * (w * ent).sum()
        if self.ptx_coef > 0 and "ptx_weight" in batch.token:
            pw = batch.token["ptx_weight"].to(dev, logp.dtype)
            ptx = (pw * -logp).sum()
            loss = loss + self.ptx_coef * ptx
            metrics["ptx_loss"] = float(ptx.detach())
        return loss, metrics


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
