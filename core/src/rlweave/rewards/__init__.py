"""Rewards: built-in rule functions, name resolution, and :class:`RewardSet`, which runs
weighted rewards in worker processes with per-call timeouts.

Attributes are imported lazily so a reward worker process (which imports
``rlweave.rewards._worker``) starts without pydantic or the config schema.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RewardSet", "load_reward_fn", "reward_records", "RewardWorkerError"]

_WHERE = {
    "RewardSet": "rlweave.rewards.reward_set",
    "load_reward_fn": "rlweave.rewards.loader",
    "reward_records": "rlweave.rewards.loader",
    "RewardWorkerError": "rlweave.rewards.pool",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'rlweave.rewards' has no attribute {name!r}")
