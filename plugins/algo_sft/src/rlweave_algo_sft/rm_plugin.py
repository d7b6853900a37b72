"""Entry point ``rm`` of rlweave-algo-sft: reward-model training (light: no torch)."""

from rlweave.plugins import AlgorithmRecord, hookimpl
from rlweave_algo_sft.rm_config import RMConfig, rm_roles


@hookimpl
def rlweave_algorithms():
    return [
        AlgorithmRecord(
            name="rm",
            summary="Reward-model training: Bradley-Terry on pairwise or ranked preferences (margin optional)",
            target="rlweave_algo_sft.rm:RewardModelTraining",
            config_model=RMConfig,
            roles=rm_roles,
        )
    ]
