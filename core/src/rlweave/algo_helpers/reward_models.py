"""Learned reward models as reward sources of any RL algorithm (GRPO and its estimators, PPO,
OnlineDPO), beside the rule rewards of the top-level ``rewards`` section.

``algorithm.reward_models`` lists roles whose model is a scalar-head reward model
(``model_type: reward``, trained with ``rm.yaml``); each scores prompt + response, closed by
one EOS as in reward-model training (:func:`scoring_batch`), and its score enters the reward
with its ``weight``. The sources are summed: ``R = rules + sum_k weight_k * score_k``.

Per step each source reports ``reward/<role>`` (its mean score) and ``reward/<role>/failed``
(how many of its scores were not finite; they count as 0, so one diverged score cannot poison
the group statistics), as the rule set reports ``reward/<name>`` and ``reward/failed``.

The config part (:class:`RewardModelEntry`) is light; the scoring functions import torch when
called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from rlweave.data.batch import Batch


class RewardModelEntry(BaseModel):
    """One learned reward model: a role (scalar-head model, ``model_type: reward``) whose
    score of prompt+response is added to the reward with ``weight``."""

    model_config = ConfigDict(extra="forbid")

    role: str = Field("reward", description="Role name of the reward model (a key of 'roles', starting with 'reward').")
    weight: float = Field(1.0, description="Weight of this model's score in the summed reward.")


def check_entries(entries: Sequence[RewardModelEntry]) -> None:
    """Raise ``ValueError`` when a role does not start with ``reward`` or is listed twice."""
    roles = [e.role for e in entries]
    bad = [r for r in roles if not r.startswith("reward")]
    if bad:
        raise ValueError(f"reward_models: role names must start with 'reward', got {bad}")
    if len(set(roles)) != len(roles):
        raise ValueError(f"reward_models: a role is listed twice: {roles}")


def scoring_batch(batch: "Batch", eos_id: int | None) -> "Batch":
    """Prompt + response of every sample, with exactly one EOS at the end (added when the
    response stopped at the length limit, kept when the engine already emitted it), so the
    reward model reads its score at an EOS token, as in reward-model training."""
    from rlweave.data.batch import Batch

    if eos_id is None:
        return batch
    seqs = []
    for s in batch.sequences():
        ids = s.tolist()
        if ids[-1] != eos_id:
            ids.append(eos_id)
        seqs.append(ids)
    return Batch.from_sequences(seqs, ids=batch.ids, meta=batch.meta, prompt_lens=batch.sample["prompt_len"].tolist())


def issue_scores(roles: Any, entries: Sequence[RewardModelEntry], batch: "Batch", eos_id: int | None) -> dict[str, Any]:
    """Start every reward model's ``scores`` call on ``batch`` (they run concurrently); returns
    role -> future."""
    if not entries:
        return {}
    sb = scoring_batch(batch, eos_id)
    return {e.role: roles[e.role].scores(sb) for e in entries}


def combine(entries: Sequence[RewardModelEntry], results: dict[str, Any], n: int,
            metrics: dict[str, float]) -> "torch.Tensor":
    """The weighted sum ``(n,)`` of the reward models' scores (``results``: role -> scores),
    non-finite scores counted as 0; adds ``reward/<role>`` and ``reward/<role>/failed`` to
    ``metrics``."""
    import torch

    total = torch.zeros(n, dtype=torch.float32)
    for e in entries:
        s = torch.as_tensor(results[e.role]).float().reshape(-1)
        if s.numel() != n:
            raise ValueError(f"reward model '{e.role}' returned {s.numel()} scores for {n} samples")
        ok = torch.isfinite(s)
        s = torch.where(ok, s, torch.zeros_like(s))
        metrics[f"reward/{e.role}"] = float(s.mean()) if n else 0.0
        metrics[f"reward/{e.role}/failed"] = float((~ok).sum())
        total = total + e.weight * s
    return total
