"""The queueing pipeline: single-turn samples streamed through a rollout queue, for the run
modes of :mod:`rlweave.algo_helpers.run_modes` (each builds it with its own
:class:`QueueSchedule`) and partial rollout.

:class:`RolloutPipeline` wraps a :class:`~rlweave.algo_helpers.rollout_queue.RolloutQueue`
with the schedule of the run mode, ``run.max_staleness`` and the ``rollout`` section:

* ``sync``: each step's records are generated, trained, then the weights are synced. The
  engine is idle while the policy trains. With partial rollout, in rounds of
  ``token_budget_per_step`` until ``data.batch_size`` groups are complete: an unfinished sample
  gets one round a step, and rounds after the first start fresh groups for those missing
  (:meth:`RolloutPipeline._widen`), so the step does not wait for its longest samples.
* ``one_step_off``: the queue holds the next step's records too; they are sent to the engine,
  as one request, before this step trains, so generation of step n+1 overlaps training of
  step n and every sample is one version old when trained.
* ``async``: the queue holds up to ``max_staleness`` steps of records beyond this one, sent as
  requests of ``rollout.request_groups`` groups (as many at once as the engine serves, its
  ``concurrent_calls``, at least two); while the policy trains, finished requests
  are merged and new ones sent (partial samples continued), so the engine never waits for
  the trainer, and weight updates reach it between requests.

In the last two the weight sync does not wait for the engine's queued requests
(:meth:`WeightSync.start`). No group is trained with a token more than ``max_staleness``
versions old: the queue generates such samples again. Versions: the policy's version is the
number of updates made (the algorithm's step count); the engine's is the version last synced.

The extra records come from ``RunContext.next_records``; the queue's state (records not yet
trained and the partial samples) is part of the algorithm's checkpoint, and the data position
already counts them, so ``--resume`` neither loses nor repeats a record.

Rollouts the controller drives (multi-turn episodes) have a pipeline of their own,
:class:`~rlweave.algo_helpers.episode_pipeline.EpisodePipeline`; plain sync steps another,
:class:`~rlweave.algo_helpers.sync_pipeline.SyncPipeline`; the run mode picks
(:func:`rlweave.algo_helpers.run_modes.make_pipeline`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from rlweave.algo_helpers.rollout import generations_to_batch
from rlweave.algo_helpers.rollout_queue import WAIT_S, GroupState, RolloutQueue
from rlweave.interfaces.engine import SamplingParams
from rlweave.interfaces.pipeline import Pipeline
from rlweave.scheduler.future import wait_any

#: sync + partial rollout: the completion rate a round's fresh groups are counted at, at least
MIN_FIRST_ROUND_RATE = 0.25


def groups_to_fill(missing: int, rate: float, confidence: float) -> int:
    """The fewest fresh groups ``n`` such that at least ``missing`` of them complete with
    probability ``confidence`` when each completes independently with probability ``rate``
    (the upper tail of Binomial(n, rate)); at least ``ceil(missing / rate)``, the count that
    completes ``missing`` on average. 0 when nothing is missing."""
    if missing <= 0:
        return 0
    rate = min(1.0, max(MIN_FIRST_ROUND_RATE, rate))
    n = math.ceil(missing / rate)
    if rate >= 1.0:
        return n
    log_r, log_q = math.log(rate), math.log1p(-rate)
    while True:
        # P(X < missing) for X ~ Binomial(n, rate), its terms in log space (large batches underflow)
        head = math.lgamma(n + 1)
        below = sum(math.exp(head - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_r + (n - k) * log_q)
                    for k in range(missing))
        if 1.0 - below >= confidence:
            return n
        n += 1


def groups_to_batch(groups: list[GroupState]) -> Any:
    """A training batch of the pipeline's complete groups (one sample per generation, see
    :func:`~rlweave.algo_helpers.rollout.generations_to_batch`)."""
    return generations_to_batch(
        [g.prompt_ids for g in groups],
        [[g.generation(k) for k in range(len(g.samples))] for g in groups],
        [str(g.record.get("id", g.serial)) for g in groups],
        [g.meta for g in groups],
    )


@dataclass(frozen=True)
class QueueSchedule:
    """How a run mode drives the queue (its module builds one, :mod:`rlweave.algo_helpers.run_modes`).

    ``overlapped``: the engine generates while the policy trains (weight syncs begun, landing
    between requests); ``lookahead``: steps of records held beyond this one; ``request_groups`` and
    ``in_flight``: groups per engine request and requests on the engine at once (None: one
    request per dispatch, as many as there are); ``staleness``: versions a trained token may lag
    (None: unbounded, sync); ``sync_first``: wait for the weight sync in flight before sending the
    next work, so it starts on the last update's weights (one_step_off)."""

    overlapped: bool = False
    lookahead: int = 0
    request_groups: int | None = None
    in_flight: int | None = None
    staleness: int | None = None
    sync_first: bool = False


class RolloutPipeline(Pipeline):
    """See the module docstring. ``ctx``: the algorithm's run context; ``n`` samples per group
    and ``max_new_tokens`` per sample (the algorithm's settings); ``encode(records)`` returns
    ``(prompt_ids, metas)`` of the records' prompts; ``schedule``: the run mode's."""

    def __init__(self, ctx: Any, n: int, max_new_tokens: int,
                 encode: Callable[[list[dict[str, Any]]], tuple[list[list[int]], list[dict[str, Any]]]],
                 schedule: QueueSchedule):
        cfg = ctx.config
        self.ctx, self.encode, self.schedule = ctx, encode, schedule
        self.batch_groups = int(cfg.data.batch_size)
        self.total_steps = int(cfg.run.total_steps)
        partial = cfg.rollout.partial
        self.lookahead = schedule.lookahead
        self.fill_confidence = float(partial.fill_confidence) if partial else 0.0
        self.rounds = 0  # rounds of the last sync step with partial rollout (partial/rounds)
        self.queue = RolloutQueue(n, max_new_tokens,
                                  token_budget=partial.token_budget_per_step if partial else None,
                                  max_rounds=partial.max_rounds if partial else 1,
                                  max_staleness=schedule.staleness, request_groups=schedule.request_groups,
                                  max_in_flight=schedule.in_flight,
                                  round_per_version=not schedule.overlapped and partial is not None)
        self.pending_sync = None
        self.horizon: int | None = None  # groups at the head of the queue worth generating now
        self.idle_policy_s = 0.0
        self._regenerated_logged = 0
        self._groups: list[GroupState] = []

    @property
    def overlapped(self) -> bool:
        return self.schedule.overlapped

    # ------------------------------------------------------------------ steps
    def next_groups(self, records: list[dict[str, Any]], steps_done: int,
                    params: Callable[[int], SamplingParams]) -> list[GroupState]:
        """Admit ``records`` (and, ahead of them, what the mode looks ahead), wait until a
        batch's worth of groups is complete, and return it (``len(records)`` groups or fewer
        when the data ran out). Before returning, an overlapping mode sends the engine the
        next work, so it generates while the caller trains; ``one_step_off`` first waits for
        the weight sync in flight to land, so that work starts on the last update's weights."""
        t0 = time.perf_counter()
        version = steps_done
        q = self.queue
        if self.schedule.sync_first:
            # the next request starts on the last update's weights, landed (a token is at most one version old)
            self._finish_sync()
        if records:
            q.admit(records, *self.encode(records))
        ahead = min(self.lookahead, max(0, self.total_steps - steps_done - 1))
        more = self.ctx.next_records
        while more is not None and len(q) < (1 + ahead) * self.batch_groups:
            extra = more()
            if not extra:
                break
            q.admit(extra, *self.encode(extra))
        want = min(len(records) or self.batch_groups, len(q))
        # sync with partial rollout: a round goes to the unfinished groups and as many fresh ones
        # as groups are missing, so a step does not wait for its longest samples (they go on in
        # the next step's rounds); otherwise the groups worth generating now
        widen = self._widen if not self.overlapped and q.token_budget is not None else None
        self.rounds = 0
        self.horizon = widen(want - q.ready()) if widen else (1 + ahead) * self.batch_groups
        generate = self.ctx.roles["rollout"].generate
        q.dispatch(generate, params, version, self.horizon)
        groups: list[GroupState] = []
        while True:
            q.wait_ready(want - len(groups), generate, params, version, self.overlapped, self.horizon, widen)
            groups += q.take(want - len(groups), version)
            if len(groups) >= want or not (q.in_flight or q.pending()):  # stale samples reset: go on
                break
        self.horizon -= len(groups)
        if self.overlapped:
            q.dispatch(generate, params, version, self.horizon)
        self.idle_policy_s = time.perf_counter() - t0
        return groups

    def _widen(self, missing: int) -> int:
        """The groups the next round of a sync step with partial rollout goes to, ``missing``
        groups short of a batch: every group started so far (the unfinished ones continue unless
        they had this step's round) and enough fresh ones that ``missing`` of them complete in
        the round with probability ``rollout.partial.fill_confidence`` if they do as the groups
        before them did (``first_round_rate``, :func:`groups_to_fill`), drawn from
        ``ctx.next_records`` when the queue holds too few; returns that count (the horizon).
        Groups completed beyond the batch are trained first in the next step."""
        q = self.queue
        self.rounds += 1
        fresh = groups_to_fill(missing, q.first_round_rate(), self.fill_confidence)
        started, more = q.started(), self.ctx.next_records
        while more is not None and len(q) - started < fresh:
            extra = more()
            if not extra:
                break
            q.admit(extra, *self.encode(extra))
        self.horizon = started + min(len(q) - started, fresh)
        return self.horizon

    def next_batch(self, records: list[dict[str, Any]], steps_done: int,
                   params: Callable[[int], SamplingParams]) -> Any:
        """:meth:`next_groups` as one training batch (:func:`groups_to_batch`);
        :meth:`step_metrics` describes its groups."""
        self._groups = self.next_groups(records, steps_done, params)
        return groups_to_batch(self._groups)

    def step_metrics(self, steps_done: int) -> dict[str, float]:
        """:meth:`metrics` of the groups the last :meth:`next_batch` returned."""
        return self.metrics(self._groups, steps_done)

    def close(self) -> None:
        """Nothing to stop: requests in flight end with :meth:`drain`."""

    def wait(self, future: Any, steps_done: int, params: Callable[[int], SamplingParams]) -> Any:
        """``future.result()``; in an overlapping mode, while it runs, merge the engine's
        finished requests and send new ones (so the engine keeps generating while the policy
        works)."""
        if self.overlapped:
            while not future.done():
                self.pump(steps_done, params)
                wait_any([future, *(r.future for r in self.queue.in_flight)], WAIT_S)
        return future.result()

    def pump(self, steps_done: int, params: Callable[[int], SamplingParams]) -> None:
        """In an overlapping mode: merge the engine's finished requests and send new ones (for
        a caller that waits on several futures itself; :meth:`wait` for one)."""
        if self.overlapped and self.queue.poll():
            self.queue.dispatch(self.ctx.roles["rollout"].generate, params, steps_done, self.horizon)

    def sync_weights(self, steps_done: int) -> dict[str, float]:
        """Sync the policy (now version ``steps_done``) into the rollout engine: blocking when
        not overlapped, else begun here (landing while the engine generates) and finished at
        the next step or at :meth:`drain`."""
        ws = self.ctx.weight_sync
        if not self.overlapped:
            info = ws.sync("policy", "rollout", version=steps_done)
        else:
            self._finish_sync()
            t0 = time.perf_counter()
            self.pending_sync = ws.start("policy", "rollout", version=steps_done)
            info = {"seconds": time.perf_counter() - t0, "bytes": 0}
        self.queue.version = steps_done
        return {"sync_bytes": float(info.get("bytes", 0)), "time/sync": float(info.get("seconds", 0.0))}

    def _finish_sync(self) -> None:
        if self.pending_sync is not None:
            pending, self.pending_sync = self.pending_sync, None
            pending.result()

    def drain(self, abort: bool = False) -> None:
        """Wait for every request and the weight sync in flight, raising the sync's error
        (before an evaluation, a checkpoint and at the end: ``Algorithm.drain``). With
        ``abort`` the engine is first asked to stop its running calls (their samples come back
        unfinished and are merged, to be continued or generated again)."""
        if abort and self.queue.in_flight:
            self.ctx.roles["rollout"].abort().result(timeout=60)
        while self.queue.in_flight:
            self.queue.poll(block=True)
        self._finish_sync()

    # ---------------------------------------------------------------- metrics
    def metrics(self, groups: list[GroupState], steps_done: int) -> dict[str, float]:
        """``staleness/*`` over the trained tokens (``steps_done``, the policy version the
        update started from, minus the token's), ``partial/ratio`` (trained samples that took
        more than one round), ``partial/rounds`` (generation rounds of a sync step with
        partial rollout), the queue's size, samples generated again for the bound in this
        step, and idle seconds of both roles in this step."""
        lags = [steps_done - v for g in groups for s in g.samples for v in s.versions]
        samples = [s for g in groups for s in g.samples]
        q = self.queue
        out = {
            "staleness/mean": sum(lags) / len(lags) if lags else 0.0,
            "staleness/max": float(max(lags)) if lags else 0.0,
            "staleness/regenerated": float(q.regenerated - self._regenerated_logged),
            "partial/ratio": sum(1 for s in samples if s.rounds > 1) / len(samples) if samples else 0.0,
            **({"partial/rounds": float(self.rounds)} if self.rounds else {}),
            "queue/groups": float(len(q)),
            "queue/unfinished": float(q.unfinished_samples()),
            "time/idle/policy": self.idle_policy_s,
            "time/idle/rollout": q.take_idle(),
        }
        self._regenerated_logged = q.regenerated
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.queue.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.queue.load_state_dict(state)
