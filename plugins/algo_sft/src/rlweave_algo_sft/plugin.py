"""Entry point ``sft`` of rlweave-algo-sft (light: no torch)."""

from rlweave.plugins import AlgorithmRecord, hookimpl
from rlweave_algo_sft.config import SFTConfig, sft_roles


def sft_reward_data(cfg: SFTConfig) -> tuple[str, ...]:
    """None to dry-run: rewards only judge held-out answers, and SFT's evaluation fills a
    record's 'answer' from its 'response' first, so raw records are not what a reward sees."""
    return ()


@hookimpl
def rlweave_algorithms():
    return [
        AlgorithmRecord(
            name="sft",
            summary="Supervised fine-tuning on query/response or chat jsonl (loss on responses only)",
            target="rlweave_algo_sft.algorithm:SFT",
            config_model=SFTConfig,
            roles=sft_roles,
            reward_data=sft_reward_data,
        )
    ]
