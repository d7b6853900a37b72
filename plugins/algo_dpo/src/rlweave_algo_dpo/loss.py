"""DPO-family losses on packed preference batches (one picklable dataclass, run on the ranks).

With ``lr(y) = log pi(y|x) - log pi_ref(y|x)`` (sequence log-probs over the response tokens)
and ``h = lr(chosen) - lr(rejected)``, one preference pair contributes

* ``sigmoid``       ``-(1-eps) log sigma(beta h) - eps log sigma(-beta h)``   (DPO; ``eps`` =
  ``label_smoothing``, 0 for plain DPO)
* ``conservative``  the same with ``eps > 0`` required (cDPO: labels flipped with prob. eps)
* ``ipo``           ``(h - 1/(2 beta))**2``                                    (IPO)
* ``hinge``         ``max(0, 1 - beta h)``                                     (SLiC)

plus, when ``sft_coef > 0``, ``sft_coef`` times the NLL of the chosen response (token mean
over the whole mini-batch, RPO-style).

Batch contract (built by :mod:`rlweave_algo_dpo.pairs`):

* sample ``pair_id`` (int64): both members of a pair carry the same id;
  ``is_chosen`` (float 1/0); ``ref_logp`` (float): the reference sequence log-prob of this
  sample, computed like :func:`sequence_logps` with the same ``average_logprobs``;
  ``pair_weight`` (float): the pair's weight in the loss (``1/num_pairs`` of the mini-batch,
  so the backend's sum over micro-batches and ranks is the mean).
* sample ``partner_logratio`` (float, optional): the partner's detached ``lr`` under the
  current policy. DPO is a per-*pair* loss; when the backend's data-parallel split or
  token-budget micro-batching puts a sample into a micro-batch without its partner, the
  sample uses this value for the partner, so the summed gradient is still exact (the
  chosen side carries the loss value, the rejected side only its gradient). Without the
  field a split pair raises ``ValueError``.
* token ``loss_mask`` (response tokens); token ``sft_weight`` when ``sft_coef > 0``: weights
  on the chosen response tokens summing to 1 over the mini-batch (0 elsewhere).

Metrics are pair-weighted sums (so the backend's sums are mini-batch means), counted once
per pair on the micro-batch that holds the chosen sample: ``dpo_loss``,
``rewards/chosen``, ``rewards/rejected``, ``rewards/margin`` (implicit rewards
``beta * lr``), ``rewards/accuracy`` (share of pairs with chosen reward strictly above
rejected), ``logps/chosen``, ``logps/rejected``, ``sft_nll`` and ``pairs`` (a count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

LOSS_TYPES = ("sigmoid", "conservative", "ipo", "hinge")

#: sample fields every preference batch must carry
REQUIRED_SAMPLE_FIELDS = ("pair_id", "is_chosen", "ref_logp", "pair_weight")


def sequence_logps(token_logprobs: torch.Tensor, batch: Any, average: bool = False,
                   mask_key: str = "loss_mask") -> torch.Tensor:
    """Per-sample ``(n,)`` sum (or mean when ``average``) of ``token_logprobs`` over the
    sample's ``mask_key`` tokens. Differentiable; a sample with no masked token gives 0."""
    mask = batch.token[mask_key].to(token_logprobs.dtype)
    idx = batch.sample_index().to(token_logprobs.device)
    n = len(batch)
    sums = torch.zeros(n, dtype=token_logprobs.dtype, device=token_logprobs.device).index_add(
        0, idx, token_logprobs * mask.to(token_logprobs.device))
    if not average:
        return sums
    counts = torch.zeros(n, dtype=mask.dtype).index_add(0, idx.cpu(), mask.cpu()).to(sums.device)
    return sums / counts.clamp(min=1.0)


def pair_loss(h: torch.Tensor, beta: float, loss_type: str, label_smoothing: float = 0.0) -> torch.Tensor:
    """Element-wise loss of log-ratio differences ``h = lr_chosen - lr_rejected``."""
    if loss_type in ("sigmoid", "conservative"):
        z = beta * h
        return -(1.0 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    if loss_type == "ipo":
        return (h - 1.0 / (2.0 * beta)) ** 2
    if loss_type == "hinge":
        return torch.relu(1.0 - beta * h)
    raise ValueError(f"unknown DPO loss_type {loss_type!r}; choose one of {', '.join(LOSS_TYPES)}")


def _pair_slots(batch: Any) -> tuple[list[int], list[int], list[int], list[int]]:
    """Index lists: (chosen with partner here, their rejected partner, chosen alone,
    rejected alone). Raises on a malformed pair (two chosen or two rejected with one id)."""
    pid = batch.sample["pair_id"].tolist()
    chosen = [bool(c) for c in (batch.sample["is_chosen"] > 0.5).tolist()]
    where: dict[tuple[int, bool], int] = {}
    for i, (p, c) in enumerate(zip(pid, chosen)):
        if (p, c) in where:
            side = "chosen" if c else "rejected"
            raise ValueError(f"DPO batch: pair {p} has two {side} samples ({batch.ids[where[(p, c)]]!r}, {batch.ids[i]!r})")
        where[(p, c)] = i
    both_c, both_r, lone_c, lone_r = [], [], [], []
    for (p, c), i in where.items():
        if c:
            j = where.get((p, False))
            if j is None:
                lone_c.append(i)
            else:
                both_c.append(i)
                both_r.append(j)
        elif (p, True) not in where:
            lone_r.append(i)
    return both_c, both_r, lone_c, lone_r


@dataclass(frozen=True)
class DPOLoss:
    """Picklable loss function ``(outputs, micro_batch) -> (loss, metrics)``; see the module
    docstring for the batch contract and the variants."""

    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    sft_coef: float = 0.0
    average_logprobs: bool = False

    needs_entropy = False  # class attribute, not a field: backends skip the entropy pass

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown DPO loss_type {self.loss_type!r}; choose one of {', '.join(LOSS_TYPES)}")
        if self.beta <= 0:
            raise ValueError(f"DPO beta must be > 0, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"DPO label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.loss_type == "conservative" and self.label_smoothing <= 0:
            raise ValueError("DPO loss_type 'conservative' needs label_smoothing > 0 (e.g. 0.1)")
        if self.loss_type in ("ipo", "hinge") and self.label_smoothing:
            raise ValueError(f"label_smoothing applies to sigmoid/conservative losses, not {self.loss_type!r}")
        if self.sft_coef < 0:
            raise ValueError(f"DPO sft_coef must be >= 0, got {self.sft_coef}")

    def __call__(self, outputs: Any, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        logp_tok = outputs.logprobs
        zero = logp_tok.sum() * 0.0  # keeps the graph for empty micro-batches
        metrics = {k: 0.0 for k in ("dpo_loss", "rewards/chosen", "rewards/rejected", "rewards/margin",
                                    "rewards/accuracy", "logps/chosen", "logps/rejected", "sft_nll", "pairs")}
        if len(batch) == 0:
            return zero, metrics
        missing = [k for k in REQUIRED_SAMPLE_FIELDS if k not in batch.sample]
        if missing:
            raise ValueError(f"DPO batch lacks sample field(s) {missing}; build it with rlweave_algo_dpo.pairs")
        seq = sequence_logps(logp_tok, batch, self.average_logprobs)
        dev, dt = seq.device, seq.dtype
        ref = batch.sample["ref_logp"].to(dev, dt)
        weight = batch.sample["pair_weight"].to(dev, dt)
        lr = seq - ref  # live log-ratio of each sample, with grad

        both_c, both_r, lone_c, lone_r = _pair_slots(batch)
        if (lone_c or lone_r) and "partner_logratio" not in batch.sample:
            i = (lone_c or lone_r)[0]
            raise ValueError(
                f"DPO micro-batch holds sample {batch.ids[i]!r} without its pair partner "
                f"(pair {int(batch.sample['pair_id'][i])}): the backend split a pair; set the DPO "
                "option partner_logprobs: always (or keep pairs together)")
        partner = batch.sample.get("partner_logratio")
        partner = partner.to(dev, dt) if partner is not None else None

        # Pairs whose chosen sample is here carry the loss value and the metrics.
        c_idx = torch.tensor(both_c + lone_c, dtype=torch.long, device=dev)
        lr_c = lr[c_idx]
        lr_r = torch.cat([lr[torch.tensor(both_r, dtype=torch.long, device=dev)],
                          partner[torch.tensor(lone_c, dtype=torch.long, device=dev)] if lone_c else lr.new_zeros(0)])
        h = lr_c - lr_r
        w = weight[c_idx]
        per_pair = pair_loss(h, self.beta, self.loss_type, self.label_smoothing)
        loss = zero + (w * per_pair).sum()

        # Pairs whose rejected sample is here alone: gradient through it, no value.
        if lone_r:
            r_idx = torch.tensor(lone_r, dtype=torch.long, device=dev)
            lp = pair_loss(partner[r_idx] - lr[r_idx], self.beta, self.loss_type, self.label_smoothing)
            loss = loss + (weight[r_idx] * (lp - lp.detach())).sum()

        if self.sft_coef > 0:
            if "sft_weight" not in batch.token:
                raise ValueError("DPO sft_coef > 0 needs the token field 'sft_weight' (see rlweave_algo_dpo.pairs)")
            nll = -(batch.token["sft_weight"].to(dev, logp_tok.dtype) * logp_tok).sum()
            loss = loss + self.sft_coef * nll
            metrics["sft_nll"] = float(nll.detach())

        with torch.no_grad():
            r_c, r_r = self.beta * lr_c.detach(), self.beta * lr_r.detach()
            rej = (batch.sample["is_chosen"] <= 0.5).to(dev)
            metrics.update({
                "dpo_loss": float((w * per_pair.detach()).sum()),
                "rewards/chosen": float((w * r_c).sum()),
                "rewards/rejected": float((w * r_r).sum()),
                "rewards/margin": float((w * (r_c - r_r)).sum()),
                "rewards/accuracy": float((w * (r_c > r_r).to(dt)).sum()),
                # sequence log-probs: each sample is counted on its own micro-batch
                "logps/chosen": float((w * seq[c_idx].detach()).sum()),
                "logps/rejected": float((weight * seq.detach() * rej.to(dt)).sum()),
                "pairs": float(c_idx.numel()),
            })
        return loss, metrics
