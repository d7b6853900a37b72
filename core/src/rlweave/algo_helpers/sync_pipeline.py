"""The plain sync pipeline (``run.mode: sync`` without partial rollout): each step's records are
generated through the rollout when the step asks, the policy trains, and the weights are synced
before the next step generates. Nothing runs between steps.

``time/generate/dispatch``, ``time/generate/wait`` (the engine calls' dispatch and wait, from
their futures) and ``time/generate/pack`` (the rest: encoding, packing, environment steps) of the
batches made since the last :meth:`SyncPipeline.step_metrics` are that call's metrics.
"""

from __future__ import annotations

import time
from typing import Any

from rlweave.interfaces.pipeline import Params, Pipeline
from rlweave.interfaces.rollout import Rollout

#: the generation times of :meth:`SyncPipeline.step_metrics`
TIMES = ("generate/dispatch", "generate/wait", "generate/pack")


class SyncPipeline(Pipeline):
    """``ctx``: the run context (``roles["rollout"]``, ``weight_sync``); ``rollout``: what turns
    records into trajectories; ``n`` trajectories per record."""

    def __init__(self, ctx: Any, rollout: Rollout, n: int):
        self.ctx, self.rollout, self.n = ctx, rollout, int(n)
        self._times = dict.fromkeys(TIMES, 0.0)

    def next_batch(self, records: list[dict[str, Any]], steps_done: int, params: Params) -> Any:
        """``rollout.run`` on ``records`` with ``params(0)``, the engine at version ``steps_done``."""
        engine = self.ctx.roles["rollout"]
        in_engine = 0.0

        def generate(prompt_ids: list[list[int]], sampling: Any) -> list:
            nonlocal in_engine
            t = time.perf_counter()
            fut = engine.generate(prompt_ids, sampling)
            gens = fut.result()
            self._times["generate/dispatch"] += getattr(fut, "dispatch_s", 0.0) + getattr(fut, "combine_s", 0.0)
            self._times["generate/wait"] += getattr(fut, "wait_s", 0.0)
            in_engine += time.perf_counter() - t
            return gens

        t0 = time.perf_counter()
        batch = self.rollout.run(records, self.n, params(0), generate, steps_done)
        # engine calls may overlap (multi-turn engine_calls): the rest is what did not wait for them
        self._times["generate/pack"] += max(0.0, time.perf_counter() - t0 - in_engine)
        return batch

    def step_metrics(self, steps_done: int) -> dict[str, float]:
        out = {f"time/{k}": v for k, v in self._times.items()}
        self._times = dict.fromkeys(TIMES, 0.0)
        return out

    def sync_weights(self, version: int) -> dict[str, float]:
        info = self.ctx.weight_sync.sync("policy", "rollout", version=version)
        return {"sync_bytes": float(info.get("bytes", 0)), "time/sync": float(info.get("seconds", 0.0))}
