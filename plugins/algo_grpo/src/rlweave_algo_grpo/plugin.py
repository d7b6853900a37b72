"""Entry point of rlweave-algo-grpo (light: no torch)."""

from rlweave.plugins import AlgorithmRecord, hookimpl
from rlweave_algo_grpo.config import GRPOConfig, grpo_partial_rollout, grpo_roles, grpo_run_modes


@hookimpl
def rlweave_algorithms():
    return [
        AlgorithmRecord(
            name="grpo",
            summary="GRPO and the critic-free family: named advantage (grpo, rloo, reinforce_pp, remax...) and loss",
            target="rlweave_algo_grpo.algorithm:GRPO",
            config_model=GRPOConfig,
            roles=grpo_roles,
            run_modes=grpo_run_modes,
            partial_rollout=grpo_partial_rollout,
            rollout=True,
        )
    ]
