"""``run.mode: sync``: each step's records are generated, trained, then the weights are synced;
the engine is idle while the policy trains. With partial rollout (``rollout.partial``) a step
generates in rounds under a token budget and leaves its longest samples to later steps: the
queueing pipeline for single continuations, episode rounds for multi-turn episodes."""

from __future__ import annotations

from typing import Any

from rlweave.algo_helpers.run_modes import episode_pipeline, partial_section, queue_pipeline
from rlweave.plugins.types import RunModeRecord

RECORD = RunModeRecord(
    name="sync", summary="generate, train, then sync the weights (partial rollout: rounds under a token budget)",
    target="rlweave.algo_helpers.run_modes.sync:build",
)


def schedule(cfg: Any, ctx: Any) -> Any:
    """The queue's schedule in sync steps with partial rollout: nothing ahead, no staleness bound."""
    from rlweave.algo_helpers.pipeline import QueueSchedule

    return QueueSchedule()


def build(ctx: Any, rollout: Any, record: Any, n: int, max_new_tokens: int) -> Any:
    if partial_section(ctx) is None:
        from rlweave.algo_helpers.sync_pipeline import SyncPipeline

        return SyncPipeline(ctx, rollout, n)
    if record.streams:
        return queue_pipeline(ctx, n, max_new_tokens, schedule(ctx.config, ctx))
    return episode_pipeline(ctx, rollout, n, lookahead=0)
