"""Per-token KL estimators between the policy and the reference model (Schulman's k1/k2/k3).

With ``r = ref_logp - logp`` evaluated on tokens sampled from the policy:

* ``k1 = -r``                 unbiased, can be negative, high variance;
* ``k2 = r**2 / 2``           biased, low variance, gradient equals that of the true KL;
* ``k3 = exp(r) - r - 1``     unbiased and always >= 0 (GRPO paper's choice).

The log-ratio is clamped to +-20 before ``exp`` so a diverged token cannot produce inf.
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Element-wise KL estimate of the same shape as ``logp``."""
    log_ratio = ref_logp - logp
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.pow(2)
    if kind == "k3":
        r = log_ratio.clamp(-20.0, 20.0)
        return torch.exp(r) - r - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {', '.join(KL_ESTIMATORS)}")
