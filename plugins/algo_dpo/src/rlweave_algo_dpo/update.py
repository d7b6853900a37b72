"""The preference update shared by DPO and OnlineDPO: reference log-probs in, optimizer
steps out.

``preference_update`` takes a pair batch (:mod:`rlweave_algo_dpo.pairs`) that already has
``ref_logp``, cuts it into mini-batches of whole pairs, adds the policy's partner log-ratios
where a pair could be split by the backend (see ``partner_logprobs`` in the config), calls
``policy.train`` and averages the returned metrics over the optimizer steps.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from rlweave_algo_dpo.loss import DPOLoss, sequence_logps
from rlweave_algo_dpo.pairs import pair_minibatches


def result(x: Any) -> Any:
    """The value of a role-handle future (or a plain value from an in-process worker)."""
    return x.result() if hasattr(x, "result") else x


def make_loss(cfg: Any) -> DPOLoss:
    return DPOLoss(beta=cfg.beta, loss_type=cfg.loss_type, label_smoothing=cfg.label_smoothing,
                   sft_coef=cfg.sft_coef, average_logprobs=cfg.average_logprobs)


def role_seq_logps(handle: Any, batch: Any, average: bool) -> torch.Tensor:
    """Sequence log-probs ``(n,)`` of ``batch`` under a role (no grad)."""
    out = result(handle.logprobs(batch))
    lp = out["logprobs"] if isinstance(out, dict) else out
    return sequence_logps(lp.float().cpu(), batch, average)


def micro_batch_budget(run_config: Any) -> int | None:
    """The policy backend's training token budget per micro-batch, when its options name one."""
    try:
        opts = run_config.roles["policy"].options
    except (AttributeError, KeyError, TypeError):
        return None
    value = opts.get("max_tokens_per_micro_batch") if isinstance(opts, dict) else None
    return int(value) if value else None


def needs_partner(cfg: Any, policy: Any, batch: Any, run_config: Any) -> bool:
    """Whether the backend might split a pair of ``batch`` (see ``partner_logprobs``)."""
    if cfg.partner_logprobs != "auto":
        return cfg.partner_logprobs == "always"
    if int(getattr(policy, "world_size", 1)) > 1:
        return True
    budget = micro_batch_budget(run_config)
    return budget is None or batch.num_tokens > budget


def preference_update(cfg: Any, loss_fn: DPOLoss, policy: Any, batch: Any, run_config: Any) -> dict[str, float]:
    """``cfg.epochs`` passes of ``cfg.mini_batches`` optimizer steps over ``batch``; returns
    the mean of the train metrics plus ``time/train_s`` and ``optimizer_steps``."""
    n_pairs = len(batch) // 2
    t0 = time.perf_counter()
    sums: dict[str, float] = {}
    steps = 0
    for _ in range(cfg.epochs):
        for mb in pair_minibatches(batch, min(cfg.mini_batches, n_pairs)):
            if needs_partner(cfg, policy, mb, run_config):
                lr = role_seq_logps(policy, mb, cfg.average_logprobs) - mb.sample["ref_logp"]
                mb.add_sample("partner_logratio", lr.view(-1, 2).flip(1).reshape(-1).contiguous())
            m = result(policy.train(mb, loss_fn))
            for k, v in m.items():
                if isinstance(v, (int, float)):
                    sums[k] = sums.get(k, 0.0) + float(v)
            steps += 1
    out = {k: v / steps for k, v in sums.items()}
    out["optimizer_steps"] = float(steps)
    out["time/train"] = time.perf_counter() - t0
    return out
