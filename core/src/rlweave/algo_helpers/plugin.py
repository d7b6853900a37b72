"""The built-in rollouts and run modes, registered through the same ``rlweave_rollouts`` and
``rlweave_run_modes`` hooks as third-party plugins (entry point ``builtin-rollouts`` in core's
pyproject.toml). Light: the rollout classes and pipelines are imported by ``record.load()``."""

from __future__ import annotations

from rlweave.algo_helpers.agent_config import check_agent
from rlweave.algo_helpers.multi_turn_config import check_multi_turn
from rlweave.algo_helpers.run_modes import async_mode, one_step_off, sync
from rlweave.plugins import RolloutRecord, RunModeRecord, hookimpl


@hookimpl
def rlweave_rollouts() -> list[RolloutRecord]:
    return [
        RolloutRecord(
            name="single_turn", summary="one continuation per prompt (the default)",
            target="rlweave.algo_helpers.rollout:SingleTurnRollout",
            run_modes=("sync", "one_step_off", "async"), streams=True,
        ),
        RolloutRecord(
            name="multi_turn", summary="episodes of model turns and environment steps (algorithm.multi_turn)",
            target="rlweave.algo_helpers.multi_turn:MultiTurnRollout", resumable=True, check=check_multi_turn,
        ),
        RolloutRecord(
            name="agent", summary="episodes run by an agent function through an OpenAI-compatible endpoint "
            "(algorithm.multi_turn.agent)",
            target="rlweave.algo_helpers.agent.rollout:AgentRollout", check=check_agent,
        ),
    ]


@hookimpl
def rlweave_run_modes() -> list[RunModeRecord]:
    return [sync.RECORD, one_step_off.RECORD, async_mode.RECORD]
