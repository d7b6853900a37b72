"""Where a sample's reward comes from: the reward sources every RL algorithm sums.

A sample's reward is the sum of every source that applies to the run, in the order of
:data:`SOURCES`::

    R = rules (the top-level ``rewards`` set) + sum_k weight_k * score_k (learned reward models)
        + what an environment paid (multi-turn episodes)

Each source is a :class:`RewardSource`: ``build(ctx, config)`` says whether it applies to a run
(``config``: the algorithm's validated config), ``issue(batch)`` starts its work without blocking
and ``collect(pending, batch)`` returns its :class:`Contribution`. The toolkit issues every source
first, then collects them in order, so reward-model calls run while the rule workers score.
``wait(future)`` (given to ``build``) is how a source awaits a role call: the toolkit's, which keeps
the rollout engine busy meanwhile in the overlapping run modes.

A new source is one class here added to :data:`SOURCES` (or registered by
:func:`register`): ``docs/rl_toolkit.md`` shows one. Sources read their settings from the
algorithm's config: ``reward_models`` (a list of
:class:`~rlweave.algo_helpers.reward_models.RewardModelEntry`) and ``rule_rewards`` (False: the
``rewards`` rules only judge held-out answers), both optional.

A source may also start work during generation: :meth:`RewardSource.during_rollout` gives the
rollout the pipeline runs. The rule rewards and the reward models do so with
``algorithm.multi_turn.reward_overlap`` (:mod:`rlweave.algo_helpers.reward_overlap`,
:mod:`rlweave.algo_helpers.reward_model_overlap`): each record's samples are scored as soon as
its episodes ended, with the result of scoring the batch at once.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from rlweave.algo_helpers import reward_models
from rlweave.algo_helpers.rollout import reward_samples
from rlweave.data.batch import Batch
from rlweave.rewards.failures import RewardFailureError
from rlweave.scheduler.trace import TRACE


@dataclass
class Contribution:
    """One source's part of the reward: ``scores`` ``(n,)``, its metrics (``reward/*`` and
    ``time/reward/*`` seconds) and, for rule rewards, each sample's per-rule ``breakdown``."""

    scores: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    breakdown: list[dict] | None = None


class RewardSource(ABC):
    """One kind of reward (see the module docstring)."""

    #: a short name for error messages
    name: str = "source"

    @classmethod
    @abstractmethod
    def build(cls, ctx: Any, config: Any, wait: Any) -> "RewardSource | None":
        """This source for the run (``ctx``: the run context), or None when it does not apply."""

    def issue(self, batch: Batch) -> Any:
        """Start scoring ``batch`` without blocking; returns what :meth:`collect` needs."""
        return None

    @abstractmethod
    def collect(self, pending: Any, batch: Batch) -> Contribution:
        """The scores of ``batch`` (blocking)."""

    def during_rollout(self, rollout: Any) -> Any:
        """The rollout the run mode's pipeline runs: ``rollout`` (default), or one that lets this
        source start on finished groups while others generate (its batches are the same)."""
        return rollout

    def close(self) -> None:
        """Stop what the source runs in the background (the toolkit calls it once, at the end)."""


class RuleRewards(RewardSource):
    """The top-level ``rewards`` rules (a :class:`~rlweave.rewards.RewardSet`, run in the reward
    workers) on each sample's last model turn, decoded."""

    name = "rules"

    def __init__(self, rules: Any, tokenizer: Any, overlap: bool = False):
        self.rules, self.tok = rules, tokenizer
        #: scoring of finished groups during generation (``reward_overlap``), or None
        self.early: Any = None
        if overlap and callable(getattr(rules, "run_calls", None)) and callable(getattr(rules, "tally", None)):
            from rlweave.algo_helpers.reward_overlap import EarlyRules

            self.early = EarlyRules(rules, tokenizer)

    @classmethod
    def build(cls, ctx: Any, config: Any, wait: Any) -> "RuleRewards | None":
        rs = ctx.rewards
        if rs is None or not getattr(rs, "entries", True) or not getattr(config, "rule_rewards", True):
            return None
        partial = getattr(getattr(getattr(ctx, "config", None), "rollout", None), "partial", None)
        overlap = bool(getattr(getattr(config, "multi_turn", None), "reward_overlap", False)) and partial is None
        return cls(rs, ctx.tokenizer, overlap)

    def during_rollout(self, rollout: Any) -> Any:
        return self.early.wrap(rollout) if self.early is not None else rollout

    def collect(self, pending: Any, batch: Batch) -> Contribution:
        t0 = time.perf_counter()
        samples = reward_samples(self.tok, batch)
        t1 = time.perf_counter()
        metrics: dict[str, float] = {}
        try:
            if self.early is None:
                totals, breakdown = TRACE.wrap("rewards", "score", self.rules.score)(samples)  # on the timeline
            else:
                outcomes, metrics = self.early.outcomes(batch, samples)
                totals, breakdown = self.rules.tally(samples, outcomes)
        except RewardFailureError as exc:  # name the failing sample's record
            raise exc.on_records(batch.ids)
        scores = torch.tensor(totals, dtype=torch.float32)
        metrics.update({"reward/rules": float(scores.mean()) if len(scores) else 0.0,
                        "time/reward/decode": t1 - t0, "time/reward/pool": time.perf_counter() - t1})
        return Contribution(scores, metrics, list(breakdown))

    def close(self) -> None:
        if self.early is not None:
            self.early.close()


class RewardModels(RewardSource):
    """Learned reward models (``reward_models``: roles with a scalar head) scoring prompt +
    response closed by one EOS (:func:`~rlweave.algo_helpers.reward_models.scoring_batch`),
    summed with their weights."""

    name = "reward_models"

    def __init__(self, ctx: Any, entries: list[Any], wait: Any, overlap: bool = False):
        self.ctx, self.entries, self.wait = ctx, entries, wait
        #: scoring of finished groups during generation (``reward_overlap``), or None
        self.early: Any = None
        if overlap:
            from rlweave.algo_helpers.reward_model_overlap import EarlyModels

            self.early = EarlyModels(ctx.roles, entries, getattr(ctx.tokenizer, "eos_token_id", None))

    @classmethod
    def build(cls, ctx: Any, config: Any, wait: Any) -> "RewardModels | None":
        entries = list(getattr(config, "reward_models", None) or [])
        if not entries:
            return None
        partial = getattr(getattr(getattr(ctx, "config", None), "rollout", None), "partial", None)
        overlap = bool(getattr(getattr(config, "multi_turn", None), "reward_overlap", False)) and partial is None
        return cls(ctx, entries, wait, overlap and not _moved(ctx, [e.role for e in entries]))

    def during_rollout(self, rollout: Any) -> Any:
        return self.early.wrap(rollout) if self.early is not None else rollout

    def issue(self, batch: Batch) -> Any:
        if self.early is not None:
            return None  # collect takes the early scores and scores the rest
        return reward_models.issue_scores(self.ctx.roles, self.entries, batch,
                                          getattr(self.ctx.tokenizer, "eos_token_id", None))

    def collect(self, pending: Any, batch: Batch) -> Contribution:
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        if self.early is not None:
            results, metrics = self.early.scores(batch, self.wait)
        else:
            results = {k: self.wait(f) for k, f in pending.items()}
        scores = reward_models.combine(self.entries, results, len(batch), metrics)
        metrics["time/reward/models"] = time.perf_counter() - t0
        return Contribution(scores, metrics)

    def close(self) -> None:
        if self.early is not None:
            self.early.close()


def _moved(ctx: Any, roles: list[str]) -> bool:
    """Whether the run's residency may put any of ``roles`` away between phases (colocation or
    ``resources.offload: always``): then they are not called while the rollout generates."""
    from rlweave.residency import Residency

    try:
        residency = Residency.for_run(ctx, list(getattr(ctx, "roles", {})), {})
    except (AttributeError, TypeError, ValueError):
        return True
    return any(r in residency.movable for r in roles)


class EnvironmentReward(RewardSource):
    """What an environment paid each episode (sample field ``env_reward``; 0 for single turns)."""

    name = "environment"

    @classmethod
    def build(cls, ctx: Any, config: Any, wait: Any) -> "EnvironmentReward":
        return cls()

    def collect(self, pending: Any, batch: Batch) -> Contribution:
        if "env_reward" not in batch.sample:
            return Contribution(torch.zeros(len(batch), dtype=torch.float32))
        return Contribution(batch.sample["env_reward"].float())


#: the sources every run is offered, in the order their scores are summed
SOURCES: list[type[RewardSource]] = [RuleRewards, RewardModels, EnvironmentReward]


def register(source: type[RewardSource]) -> type[RewardSource]:
    """Add a source to :data:`SOURCES` (usable as a class decorator); returns it."""
    if source not in SOURCES:
        SOURCES.append(source)
    return source


def build_sources(ctx: Any, config: Any, wait: Any = None) -> list[RewardSource]:
    """The sources that apply to a run, in order (``wait``: see the module docstring; default
    ``future.result()``)."""
    wait = wait or (lambda fut: fut.result())
    return [src for src in (cls.build(ctx, config, wait) for cls in SOURCES) if src is not None]


def has_reward(sources: list[RewardSource], pays: bool) -> bool:
    """Whether anything but the environment scores (``pays``: the rollout's environment pays)."""
    return pays or any(not isinstance(s, EnvironmentReward) for s in sources)
