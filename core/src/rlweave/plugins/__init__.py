"""Plugin contract (hookspecs, record types) and the plugin manager."""

from rlweave.plugins.hookspecs import hookimpl, hookspec
from rlweave.plugins.types import (
    AdvantageRecord,
    AlgorithmRecord,
    BackendRecord,
    CorrectionRecord,
    EngineRecord,
    EnvironmentRecord,
    KernelRecord,
    KLRecord,
    LossAggRecord,
    PluginRecord,
    PolicyLossRecord,
    RewardRecord,
    RolloutRecord,
    RunModeRecord,
    ToolParserRecord,
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
    "AdvantageRecord",
    "PolicyLossRecord",
    "KLRecord",
    "LossAggRecord",
    "CorrectionRecord",
    "EnvironmentRecord",
    "ToolParserRecord",
    "RolloutRecord",
    "RunModeRecord",
]
