"""Entry point of rlweave-algo-ppo (light: no torch)."""

from rlweave.plugins import AlgorithmRecord, hookimpl
from rlweave_algo_ppo.config import PPOConfig, ppo_roles


@hookimpl
def rlweave_algorithms():
    return [
        AlgorithmRecord(
            name="ppo",
            summary="PPO for RLHF: critic + GAE, reward model(s), per-token KL to the reference",
            target="rlweave_algo_ppo.algorithm:PPO",
            config_model=PPOConfig,
            roles=ppo_roles,
            run_modes=("sync", "one_step_off", "async"),
            partial_rollout=True,
        )
    ]
