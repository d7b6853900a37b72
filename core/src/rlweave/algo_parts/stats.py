"""The one normalisation convention of rlweave's algorithm parts.

Every standardisation, ``(x - mean) / (std + eps)``, whether inside a group of responses to one
prompt (GRPO advantages, PPO's ``reward_norm: group``) or over a whole batch (advantage
whitening, REINFORCE++, ``reward_norm: batch``), uses:

* statistics computed in float64, whatever the input dtype;
* the **sample** standard deviation (Bessel-corrected, ``n - 1`` in the denominator), as
  ``torch.std`` and verl do;
* ``eps`` added to the standard deviation (default ``1e-6``);
* values that are all equal (``std == 0``, including a single value) standardise to
  **exactly 0**: the centred value is set to 0 where a group's maximum equals its minimum, so a
  group of identical non-binary rewards (3.3, 3.3, ...) cannot turn a last-ulp rounding of its
  mean into a large advantage.
"""

from __future__ import annotations

import torch

DEFAULT_EPS = 1e-6


def group_index(groups: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(inverse, k)``: each sample's group as ``0..k-1`` and the number of groups."""
    _, inv = torch.unique(groups.reshape(-1), return_inverse=True)
    return inv, (int(inv.max()) + 1 if inv.numel() else 0)


def group_moments(x: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                  torch.Tensor]:
    """Per sample ``(n,)`` float64: its group's count, mean, sample std (0 for a group of one)
    and centred value (exactly 0 in a group whose values are all equal)."""
    v = x.reshape(-1).to(torch.float64)
    inv, k = group_index(groups)
    count = torch.zeros(k, dtype=torch.float64).index_add_(0, inv, torch.ones_like(v))
    mean = torch.zeros(k, dtype=torch.float64).index_add_(0, inv, v) / count.clamp(min=1.0)
    hi = torch.full((k,), -torch.inf, dtype=torch.float64).scatter_reduce(0, inv, v, "amax")
    lo = torch.full((k,), torch.inf, dtype=torch.float64).scatter_reduce(0, inv, v, "amin")
    equal = (hi == lo)[inv]
    centred = torch.where(equal, torch.zeros_like(v), v - mean[inv])
    var = torch.zeros(k, dtype=torch.float64).index_add_(0, inv, centred.pow(2)) / (count - 1).clamp(min=1.0)
    std = torch.where(equal, torch.zeros_like(v), var.sqrt()[inv])
    return count[inv], mean[inv], std, centred


def group_standardize(x: torch.Tensor, groups: torch.Tensor, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """``(x - mean_g) / (std_g + eps)`` per sample, float64 ``(n,)``; 0 where the group's values
    are all equal (a group of one included)."""
    _, _, std, centred = group_moments(x, groups)
    return torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))


def group_std(x: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Sample standard deviation of each sample's group, per sample ``(n,)`` float64."""
    return group_moments(x, groups)[2]


def masked_moments(x: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """Mean and sample standard deviation of ``x`` over ``mask > 0`` in float64 (``(0, 0)`` with
    nothing on the mask, std 0 with one value or all values equal)."""
    v = x[mask > 0].to(torch.float64)
    if v.numel() == 0:
        return 0.0, 0.0
    if bool(v.max() == v.min()):  # one value, or all equal: exactly their value and no spread
        return float(v[0]), 0.0
    mean = v.mean()
    return float(mean), float(((v - mean) ** 2).sum().div(v.numel() - 1).sqrt())


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = DEFAULT_EPS) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` on the mask with the statistics of every masked value (mean
    added back when ``shift_mean`` is False), 0 off the mask and 0 everywhere when the masked
    values are all equal; in ``x``'s dtype."""
    mean, std = masked_moments(x, mask)
    on = mask > 0
    if std == 0.0:
        y = torch.zeros_like(x, dtype=torch.float64) + (0.0 if shift_mean else mean)
    else:
        y = (x.to(torch.float64) - mean) / (std + eps) + (0.0 if shift_mean else mean)
    return torch.where(on, y, torch.zeros_like(y)).to(x.dtype)
