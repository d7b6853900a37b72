"""Partial rollout of multi-turn episodes (``rollout.partial`` with ``algorithm.multi_turn``).

:class:`EpisodeRounds` holds the groups of episodes admitted and not yet trained (one group of
``n`` episodes per record, in admission order) and hands out complete groups in rounds:

* a **round** runs every episode of the incomplete groups for at most ``token_budget_per_step``
  model tokens (:meth:`MultiTurnRollout.episodes` with ``budget``): an episode that reaches the
  budget pauses, inside a model turn or before its next one, and the next round continues it
  there; in its ``max_rounds``-th round an episode has no budget and runs to its end;
* :meth:`EpisodeRounds.take` runs rounds (one at least, while any group is incomplete) until
  ``batch_groups`` groups are complete (every episode ended) or none is incomplete, and returns
  the oldest complete ones; the others wait for a later step, their later tokens from newer
  weights (every token keeps its version);
* with ``max_staleness`` (overlapping run modes) an episode whose oldest model token is more
  than that many versions behind the policy that will train it is dropped and started again
  from its record (``regenerated``), before any round and before groups are handed out;
* :meth:`records` is what a checkpoint keeps: the records of the groups handed out and not yet
  trained and of those still held; a resumed run plays them again from their prompts (episodes
  hold environment state that is not serialisable in general), so none is lost or trained twice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rlweave.algo_helpers.multi_turn import MultiTurnRollout, Trajectory, episodes_to_batch
from rlweave.interfaces.engine import SamplingParams
from rlweave.interfaces.rollout import GenerateFn
from rlweave.rewards.fields import reward_fields

#: added to the sampling seed once per round, so rounds of one step do not repeat their seeds
ROUND_SEED_STRIDE = 1_000_003


@dataclass
class EpisodeGroup:
    """One record's ``n`` episodes (None: not started, or dropped as too stale)."""

    serial: int
    record: dict[str, Any]
    slots: list[Trajectory | None] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return all(t is not None and t.ended_by is not None for t in self.slots)


class EpisodeRounds:
    """See the module docstring. ``rollout`` runs the episodes, ``n`` per record;
    ``batch_groups`` groups are handed out per :meth:`take`."""

    def __init__(self, rollout: MultiTurnRollout, n: int, batch_groups: int, token_budget: int, max_rounds: int,
                 max_staleness: int | None = None):
        self.rollout, self.n, self.batch_groups = rollout, int(n), int(batch_groups)
        self.token_budget, self.max_rounds, self.max_staleness = int(token_budget), int(max_rounds), max_staleness
        self.held: list[EpisodeGroup] = []  # admitted, not handed out, oldest first
        self.handed: list[EpisodeGroup] = []  # handed out by the last take, not yet trained
        self.regenerated = 0
        self._serial = 0
        self._rounds = 0

    def admit(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            self.held.append(EpisodeGroup(self._serial, r, [None] * self.n))
            self._serial += 1

    def take(self, sampling: SamplingParams, generate: GenerateFn, version: int,
             policy_version: int) -> tuple[Any, dict[str, float]]:
        """Rounds on the engine (weights ``version``) until ``batch_groups`` groups are complete,
        then the oldest complete ones as one batch (:func:`episodes_to_batch`) with their
        metrics: ``staleness/*`` per model token against ``policy_version`` (the policy that
        trains them), ``partial/ratio`` (episodes that took more than one round),
        ``partial/rounds`` (rounds run here), ``queue/groups`` (groups left) and
        ``staleness/regenerated`` (episodes dropped as too stale here)."""
        rounds, regenerated = 0, self.regenerated
        while True:
            self._expire(policy_version)
            complete = [g for g in self.held if g.complete]
            todo = [g for g in self.held if not g.complete]
            if not todo or (len(complete) >= self.batch_groups and rounds):  # a round at least: the engine
                break                                                       # works while the step trains
            seed = None if sampling.seed is None else int(sampling.seed) + ROUND_SEED_STRIDE * self._rounds
            self.rollout.episodes([g.record for g in todo], self.n, dataclasses.replace(sampling, seed=seed), generate,
                                  version, carry=[g.slots for g in todo], budget=self.token_budget,
                                  max_rounds=self.max_rounds)
            rounds += 1
            self._rounds += 1
        out = complete[: self.batch_groups]
        self.held = [g for g in self.held if g not in out]
        self.handed = out
        trajs = [t for g in out for t in g.slots if t is not None]
        ages = [policy_version - v for t in trajs for v, m in zip(t.versions, t.mask) if m]
        metrics = {"staleness/mean": sum(ages) / len(ages) if ages else 0.0,
                   "staleness/max": float(max(ages, default=0)),
                   "partial/ratio": sum(t.rounds > 1 for t in trajs) / len(trajs) if trajs else 0.0,
                   "partial/rounds": float(rounds), "queue/groups": float(len(self.held)),
                   "staleness/regenerated": float(self.regenerated - regenerated)}
        batch = episodes_to_batch([g.slots for g in out], [str(g.record.get("id", g.serial)) for g in out],
                                  [reward_fields(g.record) for g in out])
        return batch, metrics

    def trained(self) -> None:
        """The groups last handed out were trained (a checkpoint no longer keeps them)."""
        self.handed = []

    def records(self) -> list[dict[str, Any]]:
        """The records of the groups handed out and not trained, then of those held."""
        return [g.record for g in self.handed + self.held]

    def close(self) -> None:
        """Close the environments of the paused episodes and forget every group."""
        for g in self.handed + self.held:
            for t in g.slots:
                if t is not None and t.ended_by is None:
                    t.end("error")
        self.held, self.handed = [], []

    def _expire(self, policy_version: int) -> None:
        if self.max_staleness is None:
            return
        oldest_allowed = policy_version - self.max_staleness
        for g in self.held:
            for k, t in enumerate(g.slots):
                if t is None:
                    continue
                model = [v for v, m in zip(t.versions, t.mask) if m]
                if model and min(model) < oldest_allowed:
                    if t.ended_by is None:
                        t.end("error")  # closes its environment
                    g.slots[k] = None
                    self.regenerated += 1
