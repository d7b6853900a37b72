"""The policy objective every RL algorithm trains with, composed of named parts.

Per trained token ``t`` of a micro-batch, with ``w`` the token weights of the chosen loss
aggregation (:mod:`rlweave.algo_parts.aggregation`)::

    loss = sum_t w_t * c_t * pg_t                       policy loss (named), off-policy factor c_t
         + kl_beta * sum_t w_t * clamp(KL_t)            KL to the reference in the loss (named estimator)
         - entropy_coef * sum_t w_t * H_t               entropy bonus
         + ptx_coef * sum_t p_t * (-logp_t)             pre-training (ptx) term, weights p_t

``pg_t`` comes from the policy loss (``ppo_clip``, ``gspo``, ``cispo`` or a plugin's), ``c_t``
from the rollout correction of ``algorithm.off_policy`` (:mod:`rlweave.algo_parts.offpolicy`; 1
when off). The old policy of ``pg_t`` is token field ``old_logprobs``, or without it (one update
per batch) the current one, detached; with ``off_policy.mode: bypass`` it is the engine's
(``rollout_logprobs``). The ptx term reads token field ``ptx_weight`` (PPO's InstructGPT mix).

Metrics are token-weighted sums (the backend sums micro-batches and ranks, giving means):
``pg_loss``, ``clip_frac``, ``ratio``, ``ppo_kl`` (k3 estimate of KL(old || new)), ``weight``,
``tokens_trained``, ``kl`` (with a KL term), ``entropy`` (when the backend returns it),
``logprob_gap`` (with the engine's log-probs), ``ptx_loss`` and ``offpolicy/*``; with the
engine's log-probs also the sums of the mismatch metrics (:mod:`rlweave.algo_parts.mismatch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlweave.algo_parts.kl import kl_value
from rlweave.algo_parts.mismatch import mismatch_sums
from rlweave.algo_parts.offpolicy import KEY, OffPolicyConfig, apply_correction, proximal_logprobs
from rlweave.algo_parts.spec import ResolvedPart


@dataclass(frozen=True)
class PolicyObjective:
    """Picklable loss function for ``policy.train(batch, loss_fn)`` (see the module docstring).

    Batch token fields read: ``token_weight``, ``advantages``, ``loss_mask``; when present
    ``old_logprobs``, ``ref_logprobs`` (KL term), ``rollout_logprobs`` (gap, off-policy,
    mismatch; required by ``off_policy.mode: bypass``), ``staleness`` (mismatch metrics by
    staleness), ``ptx_weight``. ``correction``: the off-policy correction resolved (set from
    ``off_policy`` when not given)."""

    policy_loss: ResolvedPart
    kl: ResolvedPart | None = None
    kl_beta: float = 0.0
    kl_clamp: float | None = 10.0
    entropy_coef: float = 0.0
    ptx_coef: float = 0.0
    #: read by the backend: log-probs at the sampling temperature, entropy wanted or not
    temperature: float = 1.0
    needs_entropy: bool = True
    off_policy: OffPolicyConfig | None = None
    correction: ResolvedPart | None = None

    def __post_init__(self) -> None:
        if self.correction is None and self.off_policy is not None and self.off_policy.enabled:
            object.__setattr__(self, "correction", self.off_policy.part)
        if self.correction is not None and self.off_policy is None:
            object.__setattr__(self, "off_policy", OffPolicyConfig())  # decoupled mode
        if self.entropy_coef > 0 and not self.needs_entropy:
            raise ValueError("policy objective: entropy_coef > 0 needs needs_entropy=True")
        if self.kl_beta > 0 and self.kl is None:
            raise ValueError("policy objective: kl_beta > 0 needs a KL estimator")

    def __call__(self, outputs: Any, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        logp = outputs.logprobs
        zero = logp.sum() * 0.0
        metrics = {"pg_loss": 0.0, "clip_frac": 0.0, "ratio": 0.0, "ppo_kl": 0.0, "weight": 0.0,
                   "tokens_trained": 0.0}
        if logp.numel() == 0:
            return zero, metrics
        tok = batch.token
        missing = [k for k in ("token_weight", "advantages", "loss_mask") if k not in tok]
        if missing:
            raise ValueError(f"policy objective: batch lacks token field(s) {missing}")
        dev, dt = logp.device, logp.dtype
        w = tok["token_weight"].to(dev, dt)
        adv = tok["advantages"].to(dev, dt)
        behav = tok["rollout_logprobs"].to(dev, dt) if "rollout_logprobs" in tok else None
        if self.off_policy is not None and self.off_policy.bypass:
            if behav is None:
                raise ValueError(f"{KEY}.mode is 'bypass', which uses the engine's log-probs as the old ones: the "
                                 "batch lacks token field 'rollout_logprobs'")
            old = behav
        else:
            old = tok["old_logprobs"].to(dev, dt) if "old_logprobs" in tok else logp.detach()
        mask = tok["loss_mask"].to(dev, dt)
        pg, info = self.policy_loss.load()(logp, old, adv, mask=mask, cu_seqlens=batch.cu_seqlens.to(dev),
                                           **self.policy_loss.options)
        applied = None
        if self.correction is not None:
            applied = apply_correction(self.off_policy, self.correction, logp, batch, info["ratio"])
            pg = pg * applied.coef
        off_metrics = applied.metrics if applied is not None else {}
        loss = (w * pg).sum() + zero
        log_r = (old - logp.detach()).clamp(-20.0, 20.0)
        metrics.update({
            "pg_loss": float((w * pg).detach().sum()),
            "clip_frac": float((w * info["clipped"].to(dt)).sum()),
            "ratio": float((w * info["ratio"].detach().to(dt)).sum()),
            "ppo_kl": float((w * (torch.exp(log_r) - log_r - 1.0)).sum()),
            "weight": float(w.sum()),
            "tokens_trained": float((w > 0).sum()),
            **off_metrics,
        })
        if self.kl_beta > 0 and "ref_logprobs" in tok:
            kl = kl_value(self.kl.load(), logp, tok["ref_logprobs"].to(dev, dt), self.kl_clamp)
            loss = loss + self.kl_beta * (w * kl).sum()
            metrics["kl"] = float((w * kl).detach().sum())
        if behav is not None:
            metrics["logprob_gap"] = float((w * (logp.detach() - behav).abs()).sum())
            trainer = applied.prox if applied is not None else proximal_logprobs(self.off_policy, logp, batch)
            corr = applied.correction if applied is not None else None
            metrics.update(mismatch_sums(trainer, behav, w > 0, batch.sample_index().to(dev), len(batch),
                                         tok.get("staleness"), corr.keep if corr else None,
                                         corr.truncated if corr else None))
        entropy = getattr(outputs, "entropy", None)
        if entropy is not None:
            metrics["entropy"] = float((w * entropy.detach()).sum())
        if self.entropy_coef > 0:
            if entropy is None:
                raise ValueError("policy objective: entropy_coef > 0 but the backend returned no entropy")
            loss = loss - self.entropy_coef * (w * entropy).sum()
        if self.ptx_coef > 0 and "ptx_weight" in tok:
            ptx = (tok["ptx_weight"].to(dev, dt) * -logp).sum()
            loss = loss + self.ptx_coef * ptx
            metrics["ptx_loss"] = float(ptx.detach())
        return loss, metrics
