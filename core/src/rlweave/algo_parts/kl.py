"""KL estimators between the policy and the reference model (Schulman, "Approximating KL
divergence", 2020), per token on tokens sampled from the policy, with ``r = ref_logp - logp``:

* ``k1 = -r``                 unbiased, can be negative, high variance;
* ``k2 = r**2 / 2``           biased, low variance, its gradient is that of the true KL;
* ``k3 = exp(r) - r - 1``     unbiased and always >= 0 (the GRPO paper's choice).

The log-ratio is clamped to +-20 before ``exp`` so a diverged token cannot produce inf; callers
clamp the estimate itself with :func:`kl_value` (``algorithm.kl.clamp``, default 10, as verl and
OpenRLHF do).
"""

from __future__ import annotations

from typing import Callable

import torch


def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``logp - ref_logp``."""
    return logp - ref_logp


def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``(ref_logp - logp)**2 / 2``."""
    return 0.5 * (ref_logp - logp).pow(2)


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``exp(r) - r - 1`` with ``r = clamp(ref_logp - logp, -20, 20)``."""
    r = (ref_logp - logp).clamp(-20.0, 20.0)
    return torch.exp(r) - r - 1.0


def kl_value(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], logp: torch.Tensor, ref_logp: torch.Tensor,
             clamp: float | None = 10.0) -> torch.Tensor:
    """``fn(logp, ref_logp)`` clamped to ``[-clamp, clamp]`` (None: not clamped)."""
    out = fn(logp, ref_logp)
    return out if clamp is None else out.clamp(-clamp, clamp)
