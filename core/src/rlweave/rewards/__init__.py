"""Rewards: built-in rule functions, name resolution, and :class:`RewardSet`, which runs
weighted rewards in sandboxed worker processes with per-call timeouts and stops the run
(:class:`RewardFailureError`) when a reward mostly fails.

Attributes are imported lazily so a reward worker process (which imports
``rlweave.sandbox.worker``) starts without pydantic or the config schema.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RewardSet", "load_reward_fn", "reward_records", "RewardWorkerError", "RewardFailureError"]

_WHERE = {
    "RewardSet": "rlweave.rewards.reward_set",
    "load_reward_fn": "rlweave.rewards.loader",
    "reward_records": "rlweave.rewards.loader",
    "RewardWorkerError": "rlweave.sandbox.pool",
    "RewardFailureError": "rlweave.rewards.failures",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'rlweave.rewards' has no attribute {name!r}")
