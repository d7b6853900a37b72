"""GRPO's per-token loss: the PPO clipped surrogate with separate clip ranges, plus an
optional KL term to the reference model.

Per response token ``t`` with ``ratio = exp(logp - old_logp)`` and advantage ``A``::

    pg_t = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
    loss = sum_t w_t * (pg_t + kl_beta * KL_t)

where ``w`` is the batch's ``token_weight`` (token-weight convention of
``rlweave.interfaces.backend``) and ``KL_t`` one of the k1/k2/k3 estimators against
``ref_logprobs``. Without ``old_logprobs`` in the batch (one update per batch) the old
policy is the current one, detached: the ratio is 1 and the gradient is the policy gradient.

With ``off_policy`` (``algorithm.off_policy``, :mod:`rlweave.algo_helpers.offpolicy`) each
``pg_t`` is multiplied by the stop-gradient behaviour factor ``c_t`` (truncated importance
weight, or decoupled PPO's weight with tokens above the cap dropped); the old policy above
is then the proximal one, and the KL term is not corrected.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlweave.algo_helpers.kl import kl_penalty
from rlweave.algo_helpers.offpolicy import OffPolicyConfig, policy_correction


@dataclass
class GRPOLoss:
    """Picklable loss function for ``policy.train(batch, loss_fn)``.

    Reads token fields ``token_weight``, ``advantages`` and, when present,
    ``old_logprobs``, ``ref_logprobs``, ``rollout_logprobs``. Returned metrics are
    token-weighted sums (the backend sums them over micro-batches, giving means), plus the
    ``offpolicy/*`` metrics of :func:`~rlweave.algo_helpers.offpolicy.correction_metrics`
    when ``off_policy`` corrects (None or ``correction: none``: no correction)."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_beta: float = 0.0
    kl_estimator: str = "k3"
    temperature: float = 1.0
    needs_entropy: bool = True
    off_policy: OffPolicyConfig | None = None

    def __call__(self, outputs, batch):
        logp = outputs.logprobs
        tok = batch.token
        w = tok["token_weight"].to(logp.dtype)
        adv = tok["advantages"].to(logp.dtype)
        old = tok["old_logprobs"].to(logp.dtype) if "old_logprobs" in tok else logp.detach()
        log_ratio = (logp - old).clamp(-20.0, 20.0)
        ratio = torch.exp(log_ratio)
        clipped = ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        surr1, surr2 = ratio * adv, clipped * adv
        pg = -torch.minimum(surr1, surr2)
        coef, off_metrics = policy_correction(self.off_policy, logp, batch)
        if coef is not None:
            pg = pg * coef
        loss = (w * pg).sum()
        on = (w > 0).to(logp.dtype)
        metrics = {
            "pg_loss": float((w * pg).detach().sum()),
            "clip_frac": float((w * (surr2 < surr1).to(logp.dtype)).sum()),
            "ratio": float((w * ratio.detach()).sum()),
            "weight": float(w.sum()),
            **off_metrics,
        }
        if self.kl_beta > 0 and "ref_logprobs" in tok:
            kl = kl_penalty(logp, tok["ref_logprobs"].to(logp.dtype), self.kl_estimator)
            loss = loss + self.kl_beta * (w * kl).sum()
            metrics["kl"] = float((w * kl).detach().sum())
        if "rollout_logprobs" in tok:
            gap = (logp.detach() - tok["rollout_logprobs"].to(logp.dtype)).abs()
            metrics["logprob_gap"] = float((w * gap).sum())
        entropy = getattr(outputs, "entropy", None)
        if entropy is not None:
            metrics["entropy"] = float((w * entropy.detach()).sum())
        metrics["tokens_trained"] = float(on.sum())
        return loss, metrics
