"""``run.mode: one_step_off``: the next step's batch is generated while this one trains, so every
sample is one version old when trained. Single continuations go to the engine as one request per
step (the queueing pipeline); other rollouts run in a background thread one step ahead (the
episode pipeline)."""

from __future__ import annotations

from typing import Any

from rlweave.algo_helpers.run_modes import episode_pipeline, queue_pipeline
from rlweave.algo_helpers.run_modes.overlap import overlap_problems
from rlweave.plugins.types import RunModeRecord

NAME = "one_step_off"


def check(cfg: Any, rollout: Any) -> list[tuple[str, str]]:
    out = overlap_problems(NAME, cfg)
    if cfg.run.max_staleness < 1:
        out.append(("run.max_staleness", "run.mode 'one_step_off' trains samples one version old; it needs "
                    "max_staleness >= 1 (0: use run.mode sync)"))
    return out


RECORD = RunModeRecord(
    name=NAME, summary="the next step's batch generates while this one trains (samples one version old)",
    target="rlweave.algo_helpers.run_modes.one_step_off:build", check=check,
)


def schedule(cfg: Any, ctx: Any) -> Any:
    """One request of a whole batch at a time, one step ahead, sent once the last sync landed."""
    from rlweave.algo_helpers.pipeline import QueueSchedule

    groups, staleness = int(cfg.data.batch_size), int(cfg.run.max_staleness)
    return QueueSchedule(overlapped=True, lookahead=min(1, staleness), request_groups=groups, in_flight=1,
                         staleness=staleness, sync_first=True)


def build(ctx: Any, rollout: Any, record: Any, n: int, max_new_tokens: int) -> Any:
    if record.streams:
        return queue_pipeline(ctx, n, max_new_tokens, schedule(ctx.config, ctx))
    return episode_pipeline(ctx, rollout, n, lookahead=1)
