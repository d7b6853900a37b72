"""Off-policy correction of the clipped policy-gradient loss (GRPO, PPO): the ``off_policy``
config section and the per-token behaviour weights both algorithms' losses apply.

Three policies meet in an off-policy update: the *behaviour* policy that sampled the tokens
(the engine's log-probs, token field ``rollout_logprobs``: maybe older weights, another numeric
stack), the *proximal* policy (token field ``old_logprobs``, recomputed by the trainer before
the update; without it, the current policy detached: one update per batch, ratio 1) and the
policy being trained. The PPO ratio and its clip are always taken against the proximal
policy; the behaviour importance weight ``iw = pi_prox / pi_behav`` corrects for sampling
from the behaviour policy::

    loss = sum_t token_weight_t * c_t * pg_t        c_t = stop-gradient factor below

* ``none``: ``c_t = 1`` (the loss is exactly the algorithm's own).
* ``tis`` (truncated importance sampling, as in verl / "Your efficient RL framework secretly
  brings you off-policy RL training"): ``c_t = min(iw_t, cap)``.
* ``decoupled`` (decoupled PPO, AReaL): ``c_t = iw_t`` unclipped, but tokens with
  ``iw_t > cap`` are dropped (``c_t = 0``). The proximal policy must be recomputed:
  the batch must carry ``old_logprobs``.
* ``floor`` (both): tokens with ``iw_t < floor`` are dropped.
* ``level: sequence``: one weight per sequence, ``exp(sum of its log-ratios over its trained
  tokens)``, truncated / dropped as a whole and applied to each of its tokens.

Dropped tokens keep their ``token_weight``: the loss normalisation (``loss_agg``) is the one
the algorithm computed before the update, so dropping a token lowers the loss scale instead
of re-weighting the others (AReaL divides by the original mask count the same way). Only the
policy-gradient term is corrected; KL, entropy and ptx terms are left as they are.

Log-weights are clamped to +-20 before ``exp`` so a diverged token cannot produce inf.

This module is light at import (pydantic only): the configs import it; torch is imported by
the functions that need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

if TYPE_CHECKING:  # pragma: no cover
    import torch

CORRECTIONS = ("none", "tis", "decoupled")
LEVELS = ("token", "sequence")
#: bound on the absolute log importance weight (exp(20) ~ 4.9e8)
LOG_WEIGHT_LIMIT = 20.0
#: the metrics a corrected loss returns (``truncated_frac``: ``tis`` only; max/min: only when
#: the micro-batch has trained tokens)
METRIC_KEYS = ("offpolicy/iw_mean", "offpolicy/iw_max", "offpolicy/iw_min", "offpolicy/truncated_frac",
               "offpolicy/masked_frac", "offpolicy/logprob_gap")
KEY = "algorithm.off_policy"


class OffPolicyConfig(BaseModel):
    """``algorithm.off_policy``: how the policy loss corrects for tokens sampled by another
    policy (the engine's, possibly older weights). Shared by GRPO and PPO."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    correction: Literal["none", "tis", "decoupled"] = Field(
        "none", description="none: no correction; tis: truncated importance sampling; decoupled: decoupled PPO "
        "(ratio against the recomputed proximal policy, behaviour weight above cap dropped).",
    )
    level: Literal["token", "sequence"] = Field(
        "token", description="One behaviour weight per token, or one per sequence (product of its token ratios).",
    )
    cap: float = Field(
        2.0, description="Upper bound on the behaviour importance weight: truncated to it (tis) or tokens above it "
        "dropped (decoupled).",
    )
    floor: Optional[float] = Field(
        None, description="Tokens (sequences) whose behaviour weight is below this are dropped; null: off.",
    )

    @field_validator("cap")
    @classmethod
    def _cap_positive(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"{KEY}.cap must be > 0 (the largest behaviour importance weight kept), got {v}")
        return v

    @field_validator("floor")
    @classmethod
    def _floor_below_cap(cls, v: Optional[float], info: ValidationInfo) -> Optional[float]:
        if v is None:
            return v
        if not v > 0:
            raise ValueError(f"{KEY}.floor must be > 0 or null (off), got {v}")
        cap = info.data.get("cap")
        if cap is not None and v >= cap:
            raise ValueError(f"{KEY}.floor ({v}) must be smaller than {KEY}.cap ({cap})")
        return v

    @property
    def enabled(self) -> bool:
        """Whether the loss is corrected at all (``correction`` is not ``none``)."""
        return self.correction != "none"


@dataclass
class Correction:
    """Per-token tensors of one (micro-)batch, shape ``(T,)``.

    ``coef``: the stop-gradient factor of each token's policy-gradient term (0 on dropped
    tokens); ``log_iw``: the clamped log behaviour weight (a sequence's, on each of its tokens,
    at level ``sequence``); ``keep``: bool, not dropped; ``truncated``: bool, truncated at
    ``cap`` (``tis``)."""

    coef: "torch.Tensor"
    log_iw: "torch.Tensor"
    keep: "torch.Tensor"
    truncated: "torch.Tensor"


def log_weights(prox_logp: "torch.Tensor", behav_logp: "torch.Tensor", active: "torch.Tensor", level: str,
                sample_index: "torch.Tensor | None" = None, num_samples: int = 0) -> "torch.Tensor":
    """Log behaviour weights ``log(pi_prox / pi_behav)`` per token, 0 off ``active``. At level
    ``sequence`` each token carries the sum over the ``active`` tokens of its sample
    (``sample_index``: the sample of each token, ``num_samples`` samples). Clamped to
    +-:data:`LOG_WEIGHT_LIMIT`."""
    import torch

    lr = torch.where(active, prox_logp - behav_logp, torch.zeros_like(prox_logp))
    if level == "sequence":
        if sample_index is None:
            raise ValueError("off-policy correction at level 'sequence' needs each token's sample index")
        seq = torch.zeros(num_samples, dtype=lr.dtype, device=lr.device).index_add_(0, sample_index, lr)
        lr = torch.where(active, seq[sample_index], torch.zeros_like(lr))
    elif level != "token":
        raise ValueError(f"unknown {KEY}.level {level!r}; choose one of {', '.join(LEVELS)}")
    return lr.clamp(-LOG_WEIGHT_LIMIT, LOG_WEIGHT_LIMIT)


def apply_correction(log_iw: "torch.Tensor", cfg: OffPolicyConfig) -> Correction:
    """The loss factors of :class:`Correction` from log behaviour weights (see the module
    docstring for ``tis``, ``decoupled`` and ``floor``)."""
    import torch

    iw = torch.exp(log_iw)
    keep = torch.ones_like(iw, dtype=torch.bool)
    truncated = torch.zeros_like(keep)
    if cfg.floor is not None:
        keep = keep & (iw >= cfg.floor)
    if cfg.correction == "tis":
        truncated = iw > cfg.cap
        coef = iw.clamp(max=cfg.cap)
    elif cfg.correction == "decoupled":
        keep = keep & (iw <= cfg.cap)
        coef = iw
    elif cfg.correction == "none":
        coef = torch.ones_like(iw)
    else:
        raise ValueError(f"unknown {KEY}.correction {cfg.correction!r}; choose one of {', '.join(CORRECTIONS)}")
    coef = torch.where(keep, coef, torch.zeros_like(coef))
    return Correction(coef=coef.detach(), log_iw=log_iw.detach(), keep=keep, truncated=truncated & keep)


def correction_metrics(cfg: OffPolicyConfig, corr: Correction, weight: "torch.Tensor", prox_logp: "torch.Tensor",
                       behav_logp: "torch.Tensor") -> dict[str, float]:
    """``offpolicy/*`` metrics of one micro-batch under the loss-metric convention of
    :mod:`rlweave.interfaces.backend`: ``iw_mean``, ``masked_frac``, ``truncated_frac``
    (``tis``) and ``logprob_gap`` (``|log pi_prox - log pi_behav|``) are ``weight``-weighted sums
    (the backend's sums over micro-batches and ranks are means under the algorithm's loss
    aggregation); ``iw_max`` and ``iw_min`` (raw weights, before truncation or dropping, over the
    tokens with ``weight > 0``; left out when there are none) are reduced by max and min."""
    import torch

    w = weight.detach()
    active = w > 0
    iw = torch.exp(corr.log_iw)
    out = {
        "offpolicy/iw_mean": float((w * iw).sum()),
        "offpolicy/masked_frac": float((w * (~corr.keep).to(w.dtype)).sum()),
        "offpolicy/logprob_gap": float((w * (prox_logp.detach() - behav_logp).abs()).sum()),
    }
    if cfg.correction == "tis":
        out["offpolicy/truncated_frac"] = float((w * corr.truncated.to(w.dtype)).sum())
    if bool(active.any()):
        out["offpolicy/iw_max"] = float(iw[active].max())
        out["offpolicy/iw_min"] = float(iw[active].min())
    return out


def policy_correction(cfg: OffPolicyConfig | None, logp: "torch.Tensor",
                      batch: Any) -> tuple["torch.Tensor | None", dict[str, float]]:
    """For a policy loss on one micro-batch: ``(coef, metrics)`` where ``coef`` (``(T,)``, no
    gradient) multiplies each token's policy-gradient term, or ``(None, {})`` when ``cfg`` is
    None or ``correction: none`` (the loss stays exactly as it was).

    Reads token fields ``token_weight`` (tokens with weight > 0 are the trained ones),
    ``rollout_logprobs`` (behaviour) and ``old_logprobs`` (proximal; ``logp`` detached when
    absent, except for ``decoupled``, which needs it). Raises ValueError naming the setting and
    the missing field."""
    if cfg is None or not cfg.enabled:
        return None, {}
    tok = batch.token
    if "rollout_logprobs" not in tok:
        raise ValueError(f"{KEY}.correction is {cfg.correction!r}, which needs the engine's log-probs: the batch "
                         "lacks token field 'rollout_logprobs'")
    if "old_logprobs" in tok:
        prox = tok["old_logprobs"].to(logp.device, logp.dtype)
    elif cfg.correction == "decoupled":
        raise ValueError(f"{KEY}.correction is 'decoupled', which needs the proximal policy's log-probs "
                         "recomputed before the update: the batch lacks token field 'old_logprobs'")
    else:
        prox = logp.detach()
    behav = tok["rollout_logprobs"].to(logp.device, logp.dtype)
    weight = tok["token_weight"].to(logp.device, logp.dtype)
    active = weight > 0
    index = batch.sample_index().to(logp.device) if cfg.level == "sequence" else None
    log_iw = log_weights(prox, behav, active, cfg.level, index, len(batch))
    corr = apply_correction(log_iw, cfg)
    return corr.coef, correction_metrics(cfg, corr, weight, prox, behav)


def step_metrics(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The ``offpolicy/*`` metrics of a step from its updates' metrics (``rows``, one per
    ``train`` call): the mean over updates of each mean metric, the max of ``iw_max`` and the
    min of ``iw_min``; keys no row has are left out."""
    rows = list(rows)
    out: dict[str, float] = {}
    for key in METRIC_KEYS:
        vals = [float(r[key]) for r in rows if key in r]
        if not vals:
            continue
        if key.endswith("_max"):
            out[key] = max(vals)
        elif key.endswith("_min"):
            out[key] = min(vals)
        else:
            out[key] = sum(vals) / len(vals)
    return out
