"""Rule rewards overlapped with generation (``algorithm.multi_turn.reward_overlap``).

A rollout that reports finished groups (:attr:`rlweave.interfaces.rollout.Rollout.reports_groups`:
the episode and agent rollouts) tells :class:`EarlyRules` of each record whose ``n`` samples all
ended while other episodes still generate. The group's samples are decoded at once and their reward
calls are handed to one scoring thread, which runs them on the reward workers
(:meth:`~rlweave.rewards.RewardSet.run_calls`). Concurrency is bounded: the thread runs one set of
calls at a time, on the ``reward_runtime.workers`` processes, taking every group reported while
its previous set ran; a group never waits for another to finish generating.

When the step asks for the batch's rule rewards (:meth:`EarlyRules.outcomes`) it waits for the
calls still running, runs those of any sample not scored early (the last group, a sample that
differs from the one reported), and the reward set tallies the whole batch in its order
(:meth:`~rlweave.rewards.RewardSet.tally`). So totals, breakdown, warnings, ``reward/*`` counts and
the ``reward_runtime.max_failed_share`` stop (:class:`~rlweave.rewards.failures.RewardFailureError`,
over the whole batch) are those of scoring the batch in one piece: an outcome is used only for a
sample equal to the one the batch holds. A worker error (a reward that cannot import) is raised
then, as it would be without overlap.

Step metrics: ``time/reward/overlapped`` (seconds of reward calls of the batch that ran before the
step asked for its rewards: hidden under generation) and ``time/reward/wait`` (seconds the step
then waited for calls still running).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rlweave.algo_helpers.rollout import reward_samples
from rlweave.data.batch import Batch
from rlweave.interfaces.engine import SamplingParams
from rlweave.interfaces.rollout import GenerateFn, GroupFn, Rollout
from rlweave.scheduler.trace import TRACE

#: batches whose early scores are kept until the step asks for them (older ones are forgotten)
KEPT_RUNS = 4


class RunScores:
    """The early scoring of one :meth:`Rollout.run`: the samples reported and not yet scored, each
    scored sample's ``(sample, outcomes)`` by id, the scoring jobs and their ``(start, end)``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queued: list[tuple[str, dict[str, Any]]] = []
        self.scored: dict[str, tuple[dict[str, Any], list[Any]]] = {}
        self.jobs: list[Future] = []
        self.spans: list[tuple[float, float]] = []


class RunsByBatch:
    """The early scoring runs of the last :data:`KEPT_RUNS` rollout batches, found again by the batch
    itself (its identity, checked through a weak reference): :meth:`attach` when a rollout returns,
    :meth:`_take` when the step scores that batch. Thread-safe."""

    def __init__(self) -> None:
        self._runs: OrderedDict[int, tuple[Any, Any]] = OrderedDict()  # id(batch) -> (ref, run)
        self._lock = threading.Lock()

    def attach(self, run: Any, batch: Batch) -> None:
        """``run`` is the early scoring of ``batch`` (what :meth:`Rollout.run` returned)."""
        with self._lock:
            self._runs[id(batch)] = (weakref.ref(batch), run)
            while len(self._runs) > KEPT_RUNS:
                self._runs.popitem(last=False)

    def _take(self, batch: Batch) -> Any:
        with self._lock:
            ref, run = self._runs.pop(id(batch), (None, None))
        return run if ref is not None and ref() is batch else None


class EarlyRules(RunsByBatch):
    """See the module docstring. ``rules``: the run's :class:`~rlweave.rewards.RewardSet` (with
    ``run_calls`` and ``tally``); ``tokenizer`` decodes the samples. :meth:`wrap` gives the rollout
    the pipeline runs; :meth:`outcomes` is what the rule-reward source asks; :meth:`close` stops the
    scoring thread (after its current set of calls)."""

    def __init__(self, rules: Any, tokenizer: Any):
        self.rules, self.tok = rules, tokenizer
        super().__init__()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="rlweave-reward-overlap")

    def wrap(self, rollout: Rollout) -> Rollout:
        """``rollout`` reporting its finished groups here (itself when it cannot report them)."""
        return ScoredRollout(rollout, self) if getattr(rollout, "reports_groups", False) else rollout

    def new_run(self) -> RunScores:
        return RunScores()

    def submit(self, run: RunScores, batch: Batch) -> None:
        """Queue a finished group's samples (``batch``: see :data:`~rlweave.interfaces.rollout.GroupFn`)
        for the scoring thread; returns at once."""
        samples = reward_samples(self.tok, batch)
        with run.lock:
            run.queued += list(zip(batch.ids, samples))
            run.jobs.append(self._thread.submit(self._score, run))

    def _score(self, run: RunScores) -> None:
        with run.lock:
            todo, run.queued = run.queued, []
        if not todo:  # an earlier job took them
            return
        t0 = time.perf_counter()
        outcomes = TRACE.wrap("rewards", "score", self.rules.run_calls)([s for _, s in todo])
        m = len(outcomes) // len(todo)
        with run.lock:
            for i, (sid, sample) in enumerate(todo):
                run.scored[sid] = (sample, outcomes[i * m:(i + 1) * m])
            run.spans.append((t0, time.perf_counter()))

    def outcomes(self, batch: Batch, samples: Sequence[dict[str, Any]]) -> tuple[list[Any], dict[str, float]]:
        """Every reward call's outcome for ``samples`` (``batch``'s, from
        :func:`~rlweave.algo_helpers.rollout.reward_samples`), in the order
        :meth:`~rlweave.rewards.RewardSet.run_calls` gives them for the whole list, and the metrics
        ``time/reward/overlapped`` and ``time/reward/wait``. Raises what a scoring job raised."""
        run = self._take(batch)
        asked = time.perf_counter()
        scored: dict[str, tuple[dict[str, Any], list[Any]]] = {}
        spans: list[tuple[float, float]] = []
        if run is not None:
            for job in list(run.jobs):
                job.result()
            with run.lock:
                scored = dict(run.scored)
                spans = list(run.spans)
        waited = time.perf_counter() - asked
        hidden = sum(min(end, asked) - start for start, end in spans if start < asked)
        per_sample: list[list[Any] | None] = []
        for sid, sample in zip(batch.ids, samples):
            early = scored.get(sid)
            per_sample.append(early[1] if early is not None and early[0] == sample else None)
        missing = [i for i, o in enumerate(per_sample) if o is None]
        if missing:
            late = self.rules.run_calls([samples[i] for i in missing])
            m = len(late) // len(missing)
            for j, i in enumerate(missing):
                per_sample[i] = late[j * m:(j + 1) * m]
        out = [o for row in per_sample for o in row or []]
        return out, {"time/reward/overlapped": hidden, "time/reward/wait": waited}

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)


class ScoredRollout(Rollout):
    """A rollout whose finished groups are scored early by ``early`` (an :class:`EarlyRules`, or
    anything with its ``new_run``, ``submit`` and ``attach``); it reports the groups on, so a second
    early scorer may wrap it. Everything else is the wrapped rollout's (which its owner closes)."""

    reports_groups = True

    def __init__(self, inner: Rollout, early: Any):
        self.inner, self.early = inner, early

    def run(self, records: Sequence[dict[str, Any]], n: int, sampling: SamplingParams, generate: GenerateFn,
            version: int = 0, on_group: GroupFn | None = None) -> Batch:
        run = self.early.new_run()

        def report(g: int, group: Batch) -> None:
            self.early.submit(run, group)
            if on_group is not None:
                on_group(g, group)

        batch = self.inner.run(records, n, sampling, generate, version, on_group=report)  # type: ignore[call-arg]
        self.early.attach(run, batch)
        return batch

    def close(self) -> None:
        """Nothing: the wrapped rollout is closed by its owner."""

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet
            raise AttributeError(name)
        return getattr(self.inner, name)
