"""Entry point ``fsdp``: registers the FSDP2 training backend (light, no torch)."""

from __future__ import annotations

from rlweave.plugins.hookspecs import hookimpl
from rlweave.plugins.types import BackendRecord

from rlweave_backend_fsdp.checks import check_role
from rlweave_backend_fsdp.config import FSDPConfig


@hookimpl
def rlweave_training_backends():
    return [
        BackendRecord(
            name="fsdp",
            summary="torch FSDP2 (fully_shard) on gloo/NCCL: packed varlen batches, bf16, DCP checkpoints",
            target="rlweave_backend_fsdp.worker:FSDPWorker",
            config_model=FSDPConfig,
            model_types=("causal_lm", "value", "reward"),
            parallel=("dp", "sp"),
            kernels=("moe_groupgemm",),
            router_replay=True,  # replays and records MoE routing (rlweave.backend_helpers.router_replay)
            vision=True,  # Qwen2-VL models, images in Batch.mm (rlweave.backend_helpers.hf_model.vision)
            lora=True,
            check=check_role,
        )
    ]
