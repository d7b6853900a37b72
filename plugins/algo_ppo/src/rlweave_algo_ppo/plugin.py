"""Entry point of rlweave-algo-ppo (light: no torch)."""

from rlweave.plugins import AlgorithmRecord, hookimpl
from rlweave_algo_ppo.config import PPOConfig, ppo_roles, ppo_run_modes


@hookimpl
def rlweave_algorithms():
    return [
        AlgorithmRecord(
            name="ppo",
            summary="PPO for RLHF: critic + GAE, reward model(s), per-token KL to the reference",
            target="rlweave_algo_ppo.algorithm:PPO",
            config_model=PPOConfig,
            roles=ppo_roles,
            run_modes=ppo_run_modes,
            partial_rollout=True,  # multi-turn episodes too, in rounds
            rollout=True,
        )
    ]
