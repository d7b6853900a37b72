"""SFT loss: token-weighted negative log-likelihood, ``sum_t w_t * -log p(x_t | x_<t)``,
with ``w`` the batch's ``token_weight`` (see ``rlweave.algo_helpers.weights``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SFTLoss:
    """Picklable loss for ``policy.train``; metrics are token-weighted sums (means)."""

    needs_entropy: bool = False

    def __call__(self, outputs, batch):
        w = batch.token["token_weight"].to(outputs.logprobs.dtype)
        nll = -(w * outputs.logprobs).sum()
        return nll, {"nll": float(nll.detach()), "weight": float(w.sum())}
