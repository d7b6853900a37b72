"""Rollout corrections: how the policy loss weights or drops tokens that the engine sampled with
another policy than the one the loss is anchored to (older weights, another dtype or kernel).

Each correction is ``fn(log_ratio, *, active, sample_index, num_samples, **options) ->
Correction``, all ``(T,)`` over a packed micro-batch: ``log_ratio`` is
``log pi_prox - log pi_behav`` on the trained tokens (``active``) and 0 elsewhere, unclamped
(``pi_behav``: the engine's log-probs; ``pi_prox``: see :mod:`rlweave.algo_parts.offpolicy` for
where it comes from in each mode), ``sample_index`` the sample of each token, ``num_samples``
the samples of the micro-batch. It returns a :class:`Correction` whose ``coef`` is the
stop-gradient weight ``c_t`` the policy-gradient term of each token is multiplied by in
``decoupled`` mode (0 on a dropped token)::

    rho_t = exp(B(log_ratio_t))                 B: clamp to +-LOG_WEIGHT_LIMIT
    S_i   = sum of log_ratio over sample i's trained tokens,  L_i their number
    G_i   = S_i / max(L_i, 1)                   (log of the geometric mean of rho)

* ``token_tis`` (cap):       c_t = min(rho_t, cap)
* ``seq_tis`` (cap):         c_t = min(exp(B(S_i)), cap)
* ``token_mis`` (low, high): c_t = rho_t * [low <= rho_t <= high]
* ``seq_mis`` (low, high):   c_t = exp(B(S_i)) * [low <= exp(B(S_i)) <= high]
* ``icepop`` (low, high):    as ``token_mis``, with IcePop's band [0.5, 5]
* ``geo_mask`` (low, high, token_weights): c_t = (rho_t or 1) * [low <= exp(G_i) <= high]
* ``tis``, ``decoupled``: a weight per token or per sequence (``level``), truncated at ``cap`` (tis) or
  dropped above it (decoupled), dropped below ``floor``; their options may stand beside ``correction``.

``low`` null means ``1 / high``. A sample without trained tokens has ``S_i = G_i = 0`` (weight
1): nothing here divides by zero or produces NaN, and tokens off ``active`` are never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: bound on the absolute log weight before ``exp`` (exp(20) ~ 4.9e8): a diverged token cannot give inf
LOG_WEIGHT_LIMIT = 20.0


@dataclass
class Correction:
    """Per-token tensors of one micro-batch, shape ``(T,)``.

    ``coef``: the stop-gradient weight of each token's policy-gradient term (``decoupled`` form;
    0 on dropped tokens); ``log_iw``: the clamped log weight the correction judged (a token's, its
    sequence's or its sequence's geometric mean, on each of its tokens), reported by the
    ``offpolicy/iw_*`` metrics; ``keep``: bool, not dropped; ``truncated``: bool, cut at a cap."""

    coef: torch.Tensor
    log_iw: torch.Tensor
    keep: torch.Tensor
    truncated: torch.Tensor


def bounded(log_w: torch.Tensor) -> torch.Tensor:
    """``log_w`` clamped to +-:data:`LOG_WEIGHT_LIMIT`."""
    return log_w.clamp(-LOG_WEIGHT_LIMIT, LOG_WEIGHT_LIMIT)


def per_sample(values: torch.Tensor, sample_index: torch.Tensor, num_samples: int) -> torch.Tensor:
    """``(num_samples,)``: the sum of ``values`` over each sample's tokens."""
    return torch.zeros(num_samples, dtype=values.dtype, device=values.device).index_add_(0, sample_index, values)


def on_tokens(per_sample_values: torch.Tensor, sample_index: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Each sample's value on its ``active`` tokens, 0 on the others."""
    v = per_sample_values[sample_index]
    return torch.where(active, v, torch.zeros_like(v))


def _truncate(log_iw: torch.Tensor, active: torch.Tensor, cap: float) -> Correction:
    iw = torch.exp(log_iw)
    truncated = (iw > cap) & active
    keep = torch.ones_like(active)
    return Correction(coef=iw.clamp(max=cap).detach(), log_iw=log_iw.detach(), keep=keep, truncated=truncated)


def _band(log_iw: torch.Tensor, active: torch.Tensor, low: float | None, high: float,
          weights: torch.Tensor | None = None) -> Correction:
    low = 1.0 / high if low is None else low
    iw = torch.exp(log_iw)
    keep = ((iw >= low) & (iw <= high)) | ~active
    w = iw if weights is None else weights
    coef = torch.where(keep, w, torch.zeros_like(w))
    return Correction(coef=coef.detach(), log_iw=log_iw.detach(), keep=keep, truncated=torch.zeros_like(keep))


def _seq_log_weight(log_ratio, active, sample_index, num_samples) -> torch.Tensor:
    return bounded(on_tokens(per_sample(log_ratio, sample_index, num_samples), sample_index, active))


def none(log_ratio, *, active, **_) -> Correction:
    """No correction: ``c_t = 1`` (the algorithm's own loss)."""
    ones = torch.ones_like(log_ratio)
    keep = torch.ones_like(active)
    return Correction(coef=ones, log_iw=bounded(log_ratio).detach(), keep=keep, truncated=torch.zeros_like(keep))


def token_tis(log_ratio, *, active, cap: float = 2.0, **_) -> Correction:
    """Token-level truncated importance sampling (Yao et al. 2025, "Your efficient RL framework
    secretly brings you off-policy RL training"): ``c_t = min(rho_t, cap)``."""
    return _truncate(bounded(log_ratio), active, cap)


def seq_tis(log_ratio, *, active, sample_index, num_samples, cap: float = 2.0, **_) -> Correction:
    """Sequence-level truncated importance sampling: one weight per sample, the product of its
    token ratios, truncated: ``c_t = min(exp(B(S_i)), cap)`` on each of its tokens."""
    return _truncate(_seq_log_weight(log_ratio, active, sample_index, num_samples), active, cap)


def token_mis(log_ratio, *, active, low: float | None = None, high: float = 2.0, **_) -> Correction:
    """Token-level masked importance sampling: the token's weight, or 0 (the token dropped) when
    it lies outside ``[low, high]``: ``c_t = rho_t * [low <= rho_t <= high]``."""
    return _band(bounded(log_ratio), active, low, high)


def seq_mis(log_ratio, *, active, sample_index, num_samples, low: float | None = None, high: float = 2.0,
            **_) -> Correction:
    """Sequence-level masked importance sampling: the sample's product weight on each of its
    tokens, or the whole sample dropped when that weight lies outside ``[low, high]``."""
    return _band(_seq_log_weight(log_ratio, active, sample_index, num_samples), active, low, high)


def icepop(log_ratio, *, active, low: float = 0.5, high: float = 5.0, **_) -> Correction:
    """IcePop (Ling team 2025, Ring-1T): the token's weight inside the two-sided band
    ``[low, high]``, tokens outside it dropped (their gradient masked):
    ``c_t = rho_t * [low <= rho_t <= high]``."""
    return _band(bounded(log_ratio), active, low, high)


def geo_mask(log_ratio, *, active, sample_index, num_samples, low: float | None = None, high: float = 1.001,
             token_weights: bool = True, **_) -> Correction:
    """Geometric-mean sequence rejection: a sample is dropped as a whole when the geometric mean
    of its token ratios, ``exp(G_i)``, lies outside ``[low, high]`` (length does not compound it,
    so the band is tight); kept samples carry their token weights ``rho_t`` (``token_weights``) or
    1 (pure rejection)."""
    count = per_sample(active.to(log_ratio.dtype), sample_index, num_samples).clamp(min=1.0)
    geo = per_sample(log_ratio, sample_index, num_samples) / count
    log_geo = bounded(on_tokens(geo, sample_index, active))
    token = bounded(log_ratio)
    weights = torch.exp(token) if token_weights else torch.ones_like(token)
    return _band(log_geo, active, low, high, weights=weights)


# -------------------------------------------------------- tis and decoupled (level, cap, floor)
def _legacy_log_weights(log_ratio, active, level, sample_index, num_samples) -> torch.Tensor:
    if level == "sequence":
        return _seq_log_weight(log_ratio, active, sample_index, num_samples)
    if level != "token":
        raise ValueError(f"unknown algorithm.off_policy.level {level!r}; choose one of token, sequence")
    return bounded(log_ratio)


def _legacy(log_iw: torch.Tensor, truncate: bool, cap: float, floor: float | None) -> Correction:
    iw = torch.exp(log_iw)
    keep = torch.ones_like(iw, dtype=torch.bool)
    truncated = torch.zeros_like(keep)
    if floor is not None:
        keep = keep & (iw >= floor)
    if truncate:
        truncated = iw > cap
        coef = iw.clamp(max=cap)
    else:
        keep = keep & (iw <= cap)
        coef = iw
    coef = torch.where(keep, coef, torch.zeros_like(coef))
    return Correction(coef=coef.detach(), log_iw=log_iw.detach(), keep=keep, truncated=truncated & keep)


def tis(log_ratio, *, active, sample_index=None, num_samples=0, level: str = "token", cap: float = 2.0,
        floor: float | None = None, **_) -> Correction:
    """``correction: tis``: ``c = min(w, cap)`` with ``w`` the token's weight
    (``level: token``) or its sequence's product (``level: sequence``); weights below ``floor``
    dropped."""
    return _legacy(_legacy_log_weights(log_ratio, active, level, sample_index, num_samples), True, cap, floor)


def decoupled(log_ratio, *, active, sample_index=None, num_samples=0, level: str = "token", cap: float = 2.0,
              floor: float | None = None, **_) -> Correction:
    """``correction: decoupled`` (decoupled PPO, AReaL): ``c = w`` unclipped, tokens
    (sequences) with ``w > cap`` or ``w < floor`` dropped; needs the recomputed proximal policy."""
    return _legacy(_legacy_log_weights(log_ratio, active, level, sample_index, num_samples), False, cap, floor)
