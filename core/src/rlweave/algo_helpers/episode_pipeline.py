"""``run.mode: one_step_off`` for rollouts the controller drives: multi-turn episodes, and any
:class:`~rlweave.interfaces.rollout.Rollout` other than the single-turn one (whose requests
:class:`~rlweave.algo_helpers.pipeline.RolloutPipeline` queues itself).

Each step trains the trajectories of the oldest records drawn; before they are returned, the
next step's records start their :meth:`Rollout.run` in a background thread, so the engine and
the environment work on step n+1 while the policy trains step n. The weight sync a step ends
with is applied once that thread is done and before the next run starts: the engine holds one
version for a whole run, so every trajectory is trained exactly one version old (those of the
first step: current), and no weight load meets a running engine call, also with every role in
the controller's process (``run.scheduler: in_process``).

With partial rollout (``rollout.partial``, multi-turn episodes only) a run is a series of rounds
(:class:`~rlweave.algo_helpers.episode_rounds.EpisodeRounds`): episodes cut by a round's token
budget continue in the next round, and groups not complete when a step has enough wait for a
later step; in ``one_step_off`` those are bounded by ``run.max_staleness`` per token.

State: the records drawn and not yet trained (a run's under way included, and with partial
rollout the groups held) are the pipeline's checkpoint; a resumed run samples them again from
their prompts, and the data position already counts them, so no record is lost or trained twice.
``async`` is not implemented for these rollouts (their records' ``run_modes`` say so).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rlweave.algo_helpers.episode_rounds import EpisodeRounds
from rlweave.algo_helpers.rollout import generations_to_batch
from rlweave.devices.openmp import releasing
from rlweave.interfaces.engine import SamplingParams
from rlweave.interfaces.pipeline import Pipeline
from rlweave.interfaces.rollout import Rollout

log = logging.getLogger("rlweave.algo")

#: seconds a draining error path waits for the episodes under way before it goes on without them
ABORT_WAIT_S = 120.0


class EpisodePipeline(Pipeline):
    """See the module docstring. ``ctx``: the algorithm's run context (``config.run``,
    ``config.data.batch_size``, ``next_records``, ``roles["rollout"]``, ``weight_sync``);
    ``rollout``: what turns records into trajectories; ``n`` trajectories per record;
    ``lookahead``: 1 to run the next step's records while this one trains (one_step_off), 0 for
    sync steps (with partial rollout: rounds, no staleness bound).

    The algorithm's step calls :meth:`next_batch`, then :meth:`step_metrics`, and ends with
    :meth:`sync_weights`; :meth:`drain` before an evaluation, a checkpoint and at the end."""

    def __init__(self, ctx: Any, rollout: Rollout, n: int, lookahead: int = 0):
        cfg = ctx.config
        self.ctx, self.rollout, self.n = ctx, rollout, int(n)
        self.total_steps = int(cfg.run.total_steps)
        self.lookahead = int(lookahead)
        self._ahead = self.lookahead  # steps looked ahead now (none near the end of the run)
        self.batch_groups = int(cfg.data.batch_size)
        self.queue: deque[list[dict[str, Any]]] = deque()  # record batches not trained, oldest first
        self.running: Future | None = None  # the run of ``queue[0]``
        self.running_version = 0  # the engine's weights during that run
        self.engine_version = 0
        self.pending_version: int | None = None  # a sync asked for and not applied yet
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlweave-episodes")
        self._metrics: dict[str, float] = {}
        self.rounds: EpisodeRounds | None = None  # partial rollout: the groups held between steps
        partial = cfg.rollout.partial
        if partial is not None:
            if not callable(getattr(rollout, "episodes", None)):
                raise TypeError(f"rollout.partial: {type(rollout).__name__} trajectories cannot be cut and continued; "
                                "partial rollout needs the single-turn rollout or multi-turn episodes")
            self.rounds = EpisodeRounds(rollout, self.n, self.batch_groups, partial.token_budget_per_step,
                                        partial.max_rounds, int(cfg.run.max_staleness) if self.lookahead else None)

    # ------------------------------------------------------------------ steps
    def next_batch(self, records: list[dict[str, Any]], steps_done: int,
                   params: Callable[[int], SamplingParams]) -> Any:
        """The trajectories of the oldest records drawn (``records`` join the queue, and the
        next step's are drawn from ``ctx.next_records`` ahead of them), as one batch; the next
        records' run is started before this returns. ``params(0)``: the sampling of a run
        started now; ``steps_done``: the policy's version."""
        t0 = time.perf_counter()
        if records:
            self.queue.append(list(records))
        ahead = min(self.lookahead, max(0, self.total_steps - steps_done - 1))
        self._ahead = ahead
        if self.rounds is None:  # with rounds, _start draws
            self._draw_while(lambda: len(self.queue) < 1 + ahead)
        self._metrics = {"sync_bytes": 0.0, "time/sync": 0.0}
        if not self._has_work():
            return generations_to_batch([], [], [], [])
        if self.running is None:
            self._start(params, steps_done)
        version = self.running_version
        result = self.running.result()
        self.running = None
        if self.rounds is None:
            self.queue.popleft()
            batch = result
            self._metrics.update({"staleness/mean": float(steps_done - version),
                                  "staleness/max": float(steps_done - version),
                                  "queue/groups": float(sum(len(b) for b in self.queue))})
        else:
            self.rounds.trained()  # handed to the step now (a checkpoint after it no longer needs them)
            batch, metrics = result
            self._metrics.update(metrics)
        idle = time.perf_counter() - t0
        if ahead and self._has_work():
            self._start(params, steps_done + 1)
        self._metrics["time/idle/policy"] = idle
        return batch

    def _draw_while(self, short: Callable[[], bool]) -> None:
        """Append record batches from ``ctx.next_records`` to the queue while ``short()`` (and the
        data lasts)."""
        more = self.ctx.next_records
        while more is not None and short():
            extra = more()
            if not extra:
                break
            self.queue.append(list(extra))

    def _has_work(self) -> bool:
        return bool(self.queue) or (self.rounds is not None and bool(self.rounds.held))

    def _start(self, params: Callable[[int], SamplingParams], policy: int) -> None:
        """Apply the sync asked for (the engine is idle), then run ``queue[0]`` in the thread
        (with partial rollout: rounds on the groups held); ``policy``: the version that will
        train what the run returns."""
        self._apply_sync()
        engine = self.ctx.roles["rollout"]

        def generate(prompt_ids: list[list[int]], sampling: SamplingParams) -> list:
            return engine.generate(prompt_ids, sampling).result()

        self.running_version = self.engine_version
        if self.rounds is None:
            self.running = self._pool.submit(releasing(self.rollout.run), self.queue[0], self.n, params(0), generate,
                                             self.engine_version)
            return
        # groups to work on: this step's and those looked ahead (stragglers left for a later step among them)
        want = (1 + self._ahead) * self.batch_groups
        self._draw_while(lambda: len(self.rounds.held) + sum(len(b) for b in self.queue) < want)
        while self.queue:
            self.rounds.admit(self.queue.popleft())
        self.running = self._pool.submit(releasing(self.rounds.take), params(0), generate, self.engine_version, policy)

    def step_metrics(self, steps_done: int) -> dict[str, float]:
        """``staleness/*`` (the policy's version ``steps_done`` minus the engine's during the
        trained run; with partial rollout per model token), ``queue/groups`` (records drawn and
        not trained), ``time/idle/policy`` (waiting for the run), the ``sync_bytes`` and ``time/sync`` of the weight
        sync applied in this step, and with partial rollout ``partial/*`` and
        ``staleness/regenerated`` (:meth:`EpisodeRounds.take`)."""
        return dict(self._metrics)

    def wait(self, future: Any, steps_done: int, params: Callable[[int], SamplingParams]) -> Any:
        """``future.result()`` (the background run needs no feeding)."""
        return future.result()

    def pump(self, steps_done: int, params: Callable[[int], SamplingParams]) -> None:
        """Nothing to do: the background run feeds the engine itself."""

    # ------------------------------------------------------------------ weights
    def sync_weights(self, steps_done: int) -> dict[str, float]:
        """Ask for the policy (now version ``steps_done``) in the engine: applied before the
        next run starts. Returns the ``sync_bytes`` and ``time/sync`` of the sync applied during this step (the one
        the step before asked for), which :meth:`step_metrics` has too."""
        self.pending_version = int(steps_done)
        return {k: self._metrics.get(k, 0.0) for k in ("sync_bytes", "time/sync")}

    def _apply_sync(self) -> None:
        if self.pending_version is None:
            return
        version, self.pending_version = self.pending_version, None
        info = self.ctx.weight_sync.sync("policy", "rollout", version=version)
        self.engine_version = version
        self._metrics["sync_bytes"] = self._metrics.get("sync_bytes", 0.0) + float(info.get("bytes", 0))
        self._metrics["time/sync"] = self._metrics.get("time/sync", 0.0) + float(info.get("seconds", 0.0))

    def drain(self, abort: bool = False) -> None:
        """Wait for the run under way (its trajectories stay for the next step) and apply the
        sync asked for, raising either's error (before an evaluation, a checkpoint and at the
        end). With ``abort`` (a run failing) the engine is asked to stop its calls and the run
        is given :data:`ABORT_WAIT_S`; its error is not raised, the sync not applied."""
        if abort:
            if self.running is not None and not self.running.done():
                try:
                    self.ctx.roles["rollout"].abort().result(timeout=60)
                except Exception as exc:  # noqa: BLE001 - best effort: the run is failing already
                    log.warning("the rollout engine did not stop its calls: %s", exc)
                try:
                    self.running.exception(timeout=ABORT_WAIT_S)
                except Exception as exc:  # noqa: BLE001 - still running: the failing run goes on without it
                    log.warning("episodes still under way after %.0f s: %s", ABORT_WAIT_S, type(exc).__name__)
            return
        if self.running is not None:
            self.running.result()
        self._apply_sync()

    def close(self) -> None:
        """Stop the background thread (after the run under way, if any) and close the
        environments of the episodes held."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.rounds is not None:
            self.rounds.close()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """JSON-able: the record batches drawn and not trained, oldest first (with partial
        rollout the records of the groups held come first, as one batch)."""
        held = self.rounds.records() if self.rounds is not None else []
        return {"records": ([held] if held else []) + [list(b) for b in self.queue]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.rounds is not None:
            self.rounds.close()
        self.queue = deque(list(b) for b in state.get("records", []))
        self.running = None
