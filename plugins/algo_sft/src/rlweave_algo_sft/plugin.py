"""Entry point ``sft`` of rlweave-algo-sft (light: no torch)."""

from rlweave.plugins import AlgorithmRecord, hookimpl
from rlweave_algo_sft.config import SFTConfig, sft_roles


@hookimpl
def rlweave_algorithms():
    return [
        AlgorithmRecord(
            name="sft",
            summary="Supervised fine-tuning on query/response or chat jsonl (loss on responses only)",
            target="rlweave_algo_sft.algorithm:SFT",
            config_model=SFTConfig,
            roles=sft_roles,
        )
    ]
