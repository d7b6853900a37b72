"""Dynamic sampling (DAPO): keep only the groups whose rewards disagree, generating more until the
step has as many groups as records or ``max_resample`` extra rounds are spent.

Extra rounds draw new prompts (``ctx.next_records``) or, without training data to draw from,
sample the same records again with another seed. Runs in sync steps only (the algorithm's run
modes say so): each round is generated and scored through the step toolkit.
"""

from __future__ import annotations

from typing import Any

import torch

from rlweave.algo_helpers.step_metrics import reward_breakdown
from rlweave.algo_parts.stats import group_std
from rlweave.data.batch import Batch


def sample_groups(kit: Any, records: list[dict[str, Any]], max_resample: int) -> tuple[Batch, torch.Tensor,
                                                                                       dict[str, float]]:
    """``(batch, scores, stats)``: the groups kept (renumbered), their summed rewards, and
    ``groups_total``, ``groups_kept``, ``resample_rounds``; the step's per-rule reward metrics are
    those of the samples kept."""
    want = len(records)
    batch = kit.generate(records)
    rewards, breakdown = kit.score(batch)
    stats = {"groups_total": float(len(records))}
    keep_b, keep_r, keep_d = [], [], []
    rounds = 0
    while True:
        std = group_std(rewards, batch.sample["group"])
        good = (std > 0).nonzero().flatten().tolist()
        for g in sorted(set(batch.sample["group"][good].tolist())):
            if len(keep_b) >= want:
                break
            idx = (batch.sample["group"] == g).nonzero().flatten().tolist()
            sub = batch.select(idx)
            sub.sample["group"] = torch.full((len(idx),), len(keep_b), dtype=torch.long)
            keep_b.append(sub)
            keep_r.append(rewards[idx])
            keep_d.extend(breakdown[i] for i in idx)
        if len(keep_b) >= want or rounds >= max_resample:
            break
        rounds += 1
        more = kit.ctx.next_records
        new_records = more() if more is not None else records
        batch = kit.generate(new_records, salt=rounds)
        rewards, breakdown = kit.score(batch)
        stats["groups_total"] += len(new_records)
    stats.update({"groups_kept": float(len(keep_b)), "resample_rounds": float(rounds)})
    if any(keep_d):
        kit.metrics.update(reward_breakdown(keep_d))
    if not keep_b:
        return batch.select([]), rewards[:0], stats
    return Batch.concat(keep_b), torch.cat(keep_r), stats
