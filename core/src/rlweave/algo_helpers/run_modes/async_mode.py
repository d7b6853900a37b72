"""``run.mode: async``: samples stream through a bounded queue in requests of
``rollout.request_groups`` groups, generated up to ``run.max_staleness`` versions ahead of
training; weight updates reach the engine between requests. Needs a rollout whose requests the
queue issues itself (the single-turn rollout)."""

from __future__ import annotations

from typing import Any

from rlweave.algo_helpers.run_modes import queue_pipeline
from rlweave.algo_helpers.run_modes.overlap import overlap_problems
from rlweave.plugins.types import RunModeRecord

NAME = "async"


def check(cfg: Any, rollout: Any) -> list[tuple[str, str]]:
    out = overlap_problems(NAME, cfg)
    if rollout is not None and not rollout.streams:
        out.append(("run.mode", f"run.mode 'async' streams single-turn requests through a queue; rollout "
                    f"'{rollout.name}' does not stream its generation (use one_step_off)"))
    return out


RECORD = RunModeRecord(
    name=NAME, summary="samples stream through a bounded queue, up to run.max_staleness versions ahead",
    target="rlweave.algo_helpers.run_modes.async_mode:build", check=check,
)


def schedule(cfg: Any, ctx: Any) -> Any:
    """Requests of ``rollout.request_groups`` groups (a quarter of a batch by default), as many on
    the engine at once as it serves (at least two), ``max_staleness`` steps of records ahead."""
    from rlweave.algo_helpers.pipeline import QueueSchedule

    staleness = int(cfg.run.max_staleness)
    groups = cfg.rollout.request_groups or max(1, int(cfg.data.batch_size) // 4)
    in_flight = max(2, int(getattr(ctx.roles["rollout"], "concurrent_calls", 1)))
    return QueueSchedule(overlapped=True, lookahead=staleness, request_groups=groups, in_flight=in_flight,
                         staleness=staleness)


def build(ctx: Any, rollout: Any, record: Any, n: int, max_new_tokens: int) -> Any:
    if not record.streams:
        raise ValueError(f"run.mode 'async' needs a rollout that streams its requests; '{record.name}' does not")
    return queue_pipeline(ctx, n, max_new_tokens, schedule(ctx.config, ctx))
