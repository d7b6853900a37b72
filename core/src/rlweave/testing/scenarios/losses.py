"""Loss functions the backend scenarios train with, in the worker contract's form:
``loss(outputs, micro_batch) -> (scalar loss, metrics)``, weighted by the batch's
``token_weight`` (token-mean over the whole batch, so micro-batches and ranks add up to the
full batch's loss)."""

from __future__ import annotations


def nll_loss(outputs, mb):
    """Token-weighted negative log-likelihood (token-weight convention)."""
    loss = -(mb.token["token_weight"] * outputs.logprobs).sum()
    return loss, {"nll": float(loss.detach())}


nll_loss.needs_entropy = False


def value_loss(outputs, mb):
    """Token-weighted squared error of values to 1.0."""
    loss = (mb.token["token_weight"] * (outputs.values - 1.0) ** 2).sum()
    return loss, {"vloss": float(loss.detach())}


value_loss.needs_entropy = False


class TemperedLogprobSum:
    """Loss whose ``temperature`` the backend must honour; its metric ``wlp`` is the
    token-weighted sum of the training forward's log-probs (a loss of zero: no update)."""

    needs_entropy = False

    def __init__(self, temperature: float):
        self.temperature = temperature

    def __call__(self, outputs, mb):
        wlp = (mb.token["token_weight"] * outputs.logprobs).sum()
        return wlp * 0.0, {"wlp": float(wlp.detach())}


class NaNOnRank:
    """:func:`nll_loss` plus NaN on global rank ``rank`` only: a step whose loss is not finite
    on one rank while its gradients stay finite (the derivative of ``loss + nan`` is that of
    ``loss``), so a backend must look at every rank's loss, not only the gradient norm, to
    skip it."""

    needs_entropy = False

    def __init__(self, rank: int):
        self.rank = rank

    def __call__(self, outputs, mb):
        import torch.distributed as dist

        loss, metrics = nll_loss(outputs, mb)
        if dist.get_rank() == self.rank:
            loss = loss + float("nan")
        return loss, metrics
