"""Entry point of rlweave-algo-dpo (light: no torch): algorithms ``dpo`` and ``online_dpo``."""

from rlweave.plugins import AlgorithmRecord, hookimpl
from rlweave_algo_dpo.config import DPOConfig, OnlineDPOConfig, dpo_roles, online_dpo_roles


@hookimpl
def rlweave_algorithms():
    return [
        AlgorithmRecord(
            name="dpo",
            summary="DPO on preference pairs (sigmoid/IPO/conservative/hinge, optional SFT term)",
            target="rlweave_algo_dpo.dpo:DPO",
            config_model=DPOConfig,
            roles=dpo_roles,
        ),
        AlgorithmRecord(
            name="online_dpo",
            summary="OnlineDPO: k samples per prompt, best-vs-worst pairs by reward, DPO loss, weight sync",
            target="rlweave_algo_dpo.online_dpo:OnlineDPO",
            config_model=OnlineDPOConfig,
            roles=online_dpo_roles,
        ),
    ]
