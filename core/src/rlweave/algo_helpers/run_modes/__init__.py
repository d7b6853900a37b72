"""The built-in run modes (``run.mode``), one module each: the mode's record (a plugin record,
registered by :mod:`rlweave.algo_helpers.plugin` like a third party's), the checks it needs of a
run config, and how it builds the pipeline that feeds each step
(:class:`rlweave.interfaces.pipeline.Pipeline`):

* :mod:`.sync`: generate, train, sync; with partial rollout, rounds under a token budget;
* :mod:`.one_step_off`: the next step's batch is generated while this one trains;
* :mod:`.async_mode`: samples stream through a bounded queue, up to ``run.max_staleness`` ahead.

A new run mode is one module like these, with a ``rlweave_run_modes`` hook returning its record
(``docs/rl_toolkit.md``). These modules are light; each ``build`` imports its pipeline when called.
"""

from __future__ import annotations

from typing import Any


def make_pipeline(ctx: Any, rollout: Any, rollout_record: Any, n: int, max_new_tokens: int) -> Any:
    """The pipeline of the run's ``run.mode`` (``sync`` for contexts without a run config) for
    ``rollout`` (built from ``rollout_record``), ``n`` samples per record of at most
    ``max_new_tokens`` tokens."""
    from rlweave.plugins.manager import get_plugin_manager

    mode = getattr(getattr(ctx.config, "run", None), "mode", "sync")
    build = get_plugin_manager().get("run_mode", mode, where="run.mode").load()
    return build(ctx, rollout, rollout_record, n, max_new_tokens)


def partial_section(ctx: Any) -> Any:
    """``rollout.partial`` of the run (None: off, or no run config)."""
    return getattr(getattr(ctx.config, "rollout", None), "partial", None)


def queue_pipeline(ctx: Any, n: int, max_new_tokens: int, schedule: Any) -> Any:
    """The queueing pipeline (:class:`~rlweave.algo_helpers.pipeline.RolloutPipeline`) of the
    single-turn rollout, driven by a mode's ``schedule``."""
    import functools

    from rlweave.algo_helpers.pipeline import RolloutPipeline
    from rlweave.algo_helpers.rollout import encode_records

    return RolloutPipeline(ctx, n, max_new_tokens,
                           functools.partial(encode_records, ctx.tokenizer, vision=getattr(ctx, "vision", None)),
                           schedule)


def episode_pipeline(ctx: Any, rollout: Any, n: int, lookahead: int) -> Any:
    """The pipeline of rollouts the controller calls
    (:class:`~rlweave.algo_helpers.episode_pipeline.EpisodePipeline`)."""
    from rlweave.algo_helpers.episode_pipeline import EpisodePipeline

    return EpisodePipeline(ctx, rollout, n, lookahead=lookahead)
