"""Reward-model scoring overlapped with generation (``algorithm.multi_turn.reward_overlap``).

The learned-reward counterpart of :mod:`rlweave.algo_helpers.reward_overlap`: a rollout that
reports finished groups (the episode and agent rollouts) tells :class:`EarlyModels` of each record
whose samples all ended while other episodes still generate; one scoring thread sends the groups
reported so far to every reward-model role (``scores`` of prompt + response closed by one EOS,
:func:`~rlweave.algo_helpers.reward_models.scoring_batch`) and keeps each sample's scores.
Concurrency is bounded: one ``scores`` call per role at a time, taking every group reported while
the previous one ran.

It applies only where the reward roles stay resident during generation (the residency never moves
them: no ``resources.colocate`` group and no ``resources.offload: always`` puts them away), so a
call never races an offload. When the step asks for the reward models' scores
(:meth:`EarlyModels.scores`) it waits for the calls still running and scores in one more call per
role the samples not scored early (the last group, a sample that differs from the one reported).
A sample's score comes from the same model and weights either way; a backend whose scores depend on
what else is in the call (packing) may differ in the last bits. A failed call raises then.

Step metrics: ``time/reward/models_overlapped`` (seconds of reward-model calls of the batch that
ran before the step asked: hidden under generation) and ``time/reward/models_wait`` (seconds the
step then waited for calls still running).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from rlweave.algo_helpers.reward_models import scoring_batch
from rlweave.algo_helpers.reward_overlap import RunsByBatch, ScoredRollout
from rlweave.data.batch import Batch
from rlweave.interfaces.rollout import Rollout
from rlweave.scheduler.trace import TRACE


class ModelRun:
    """The early scoring of one :meth:`Rollout.run`: groups reported and not yet sent, each scored
    sample's ``(token ids, {role: score})`` by id, the scoring jobs and their ``(start, end)``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queued: list[Batch] = []
        self.scored: dict[str, tuple[tuple[int, ...], dict[str, float]]] = {}
        self.jobs: list[Future] = []
        self.spans: list[tuple[float, float]] = []


def _result(future: Any) -> Any:
    return future.result()


def _seqs(batch: Batch) -> list[tuple[int, ...]]:
    return [tuple(s.tolist()) for s in batch.sequences()]


class EarlyModels(RunsByBatch):
    """See the module docstring. ``roles``: the run's role handles; ``entries``: the
    ``reward_models`` (:class:`~rlweave.algo_helpers.reward_models.RewardModelEntry`); ``eos_id``:
    the EOS closing each scored sample. :meth:`wrap` gives the rollout the pipeline runs;
    :meth:`scores` is what the reward-model source asks; :meth:`close` stops the scoring thread."""

    def __init__(self, roles: Any, entries: Sequence[Any], eos_id: int | None):
        self.roles, self.entries, self.eos_id = roles, list(entries), eos_id
        super().__init__()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="rlweave-reward-model-overlap")

    def wrap(self, rollout: Rollout) -> Rollout:
        """``rollout`` reporting its finished groups here (itself when it cannot report them)."""
        return ScoredRollout(rollout, self) if getattr(rollout, "reports_groups", False) else rollout

    def new_run(self) -> ModelRun:
        return ModelRun()

    def submit(self, run: ModelRun, batch: Batch) -> None:
        """Queue a finished group (``batch``: see :data:`~rlweave.interfaces.rollout.GroupFn`) for the
        scoring thread; returns at once."""
        with run.lock:
            run.queued.append(batch)
            run.jobs.append(self._thread.submit(self._score, run))

    def _call(self, batch: Batch, wait: Callable[[Any], Any] = _result) -> dict[str, torch.Tensor]:
        """Every reward model's scores ``(n,)`` of ``batch``, the calls issued together and awaited
        with ``wait``."""
        sb = scoring_batch(batch, self.eos_id)
        futures = {e.role: self.roles[e.role].scores(sb) for e in self.entries}
        return {role: torch.as_tensor(wait(f)).float().reshape(-1) for role, f in futures.items()}

    def _score(self, run: ModelRun) -> None:
        with run.lock:
            todo, run.queued = run.queued, []
        if not todo:  # an earlier job took them
            return
        batch = Batch.concat(todo)
        t0 = time.perf_counter()
        scores = TRACE.wrap("rewards", "models", self._call)(batch)
        with run.lock:
            for i, (sid, seq) in enumerate(zip(batch.ids, _seqs(batch))):
                run.scored[sid] = (seq, {role: float(s[i]) for role, s in scores.items()})
            run.spans.append((t0, time.perf_counter()))

    def scores(self, batch: Batch, wait: Callable[[Any], Any] = _result
               ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Each reward model's scores ``(n,)`` of ``batch`` (role -> tensor, in the batch's order) and
        the metrics ``time/reward/models_overlapped`` and ``time/reward/models_wait``; ``wait``
        awaits the calls for samples not scored early (the toolkit's keeps the engine busy). Raises
        what a scoring call raised."""
        run = self._take(batch)
        asked = time.perf_counter()
        scored: dict[str, tuple[tuple[int, ...], dict[str, float]]] = {}
        spans: list[tuple[float, float]] = []
        if run is not None:
            for job in list(run.jobs):
                job.result()
            with run.lock:
                scored, spans = dict(run.scored), list(run.spans)
        waited = time.perf_counter() - asked
        hidden = sum(min(end, asked) - start for start, end in spans if start < asked)
        seqs = _seqs(batch)
        early = [scored.get(sid) for sid in batch.ids]
        rows = [e[1] if e is not None and e[0] == seq else None for e, seq in zip(early, seqs)]
        missing = [i for i, r in enumerate(rows) if r is None]
        if missing:
            late = self._call(batch.select(missing), wait)
            for j, i in enumerate(missing):
                rows[i] = {role: float(s[j]) for role, s in late.items()}
        out = {e.role: torch.tensor([r[e.role] for r in rows], dtype=torch.float32) for e in self.entries}
        return out, {"time/reward/models_overlapped": hidden, "time/reward/models_wait": waited}

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)
