"""Entry point of rlweave-algo-grpo (light: no torch)."""

from rlweave.plugins import AlgorithmRecord, hookimpl
from rlweave_algo_grpo.config import GRPOConfig, grpo_roles


@hookimpl
def rlweave_algorithms():
    return [
        AlgorithmRecord(
            name="grpo",
            summary="GRPO: group-relative advantages, clipped surrogate (Dr.GRPO/DAPO options)",
            target="rlweave_algo_grpo.algorithm:GRPO",
            config_model=GRPOConfig,
            roles=grpo_roles,
        )
    ]
