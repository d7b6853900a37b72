"""Entry point of rlweave-algo-dpo (light: no torch): algorithms ``dpo`` and ``online_dpo``."""

from rlweave.plugins import AlgorithmRecord, hookimpl
from rlweave_algo_dpo.config import DPOConfig, OnlineDPOConfig, dpo_roles, online_dpo_roles


def dpo_reward_data(cfg: DPOConfig) -> tuple[str, ...]:
    """DPO's rewards only judge held-out answers (data.eval)."""
    return ("eval",)


def online_dpo_reward_data(cfg: OnlineDPOConfig) -> tuple[str, ...]:
    """OnlineDPO scores its own samples of data.train with the rule rewards (reward_source 'rules')."""
    return ("train", "eval") if getattr(cfg, "reward_source", "rules") == "rules" else ("eval",)


@hookimpl
def rlweave_algorithms():
    return [
        AlgorithmRecord(
            name="dpo",
            summary="DPO on preference pairs (sigmoid/IPO/conservative/hinge, optional SFT term)",
            target="rlweave_algo_dpo.dpo:DPO",
            config_model=DPOConfig,
            roles=dpo_roles,
            reward_data=dpo_reward_data,
        ),
        AlgorithmRecord(
            name="online_dpo",
            summary="OnlineDPO: k samples per prompt, best-vs-worst pairs by reward, DPO loss, weight sync",
            target="rlweave_algo_dpo.online_dpo:OnlineDPO",
            config_model=OnlineDPOConfig,
            roles=online_dpo_roles,
            reward_data=online_dpo_reward_data,
            rollout=True,
        ),
    ]
