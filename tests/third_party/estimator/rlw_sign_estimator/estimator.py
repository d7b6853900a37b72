"""``A_i = scale * sign(R_i - mean_g)``; each call appends a line to $RLW_SIGN_ESTIMATOR_LOG when set."""
import json
import os

import torch


def sign_baseline(*, scores, groups, mask, cu_seqlens, scale=1.0, **_):
    r = scores.double()
    _, inv = torch.unique(groups, return_inverse=True)
    k = int(inv.max()) + 1
    mean = torch.zeros(k, dtype=torch.float64).index_add_(0, inv, r) / torch.bincount(inv, minlength=k)
    adv = scale * torch.sign(r - mean[inv])
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    per_token = adv[torch.repeat_interleave(torch.arange(lens.numel()), lens)] * (mask > 0)
    log = os.environ.get("RLW_SIGN_ESTIMATOR_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"samples": int(r.numel()), "scale": scale}) + "\n")
    return per_token.float(), None
