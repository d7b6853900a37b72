"""Implements a hook that does not exist (beside a valid one)."""
from rlweave.plugins import RewardRecord, hookimpl


@hookimpl
def rlweave_rewards():
    return [RewardRecord(name="hookreward", summary="never offered", target="x:y")]


@hookimpl
def rlweave_optimizer():
    return []
