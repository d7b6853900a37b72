"""Plugin contract (hookspecs, record types) and the plugin manager."""

from rlweave.plugins.hookspecs import hookimpl, hookspec
from rlweave.plugins.types import (
    AlgorithmRecord,
    BackendRecord,
    EngineRecord,
    KernelRecord,
    PluginRecord,
    RewardRecord,
)

__all__ = [
    "hookimpl",
    "hookspec",
    "PluginRecord",
    "BackendRecord",
    "EngineRecord",
    "AlgorithmRecord",
    "RewardRecord",
    "KernelRecord",
]
