"""Entry point ``deepspeed``: registers the DeepSpeed ZeRO training backend (light: no torch,
no deepspeed import)."""

from __future__ import annotations

import importlib.util

from rlweave.plugins.hookspecs import hookimpl
from rlweave.plugins.types import BackendRecord

from rlweave_backend_deepspeed.checks import check_role
from rlweave_backend_deepspeed.config import DeepSpeedConfig

MISSING = "deepspeed is not installed: pip install 'deepspeed>=0.19,<0.20'"


def probe() -> str | None:
    """None when deepspeed can be imported, else how to install it (found without importing it)."""
    return None if importlib.util.find_spec("deepspeed") is not None else MISSING


@hookimpl
def rlweave_training_backends():
    return [
        BackendRecord(
            name="deepspeed",
            summary="DeepSpeed ZeRO 1/2/3 with optimizer/parameter offload (gloo on CPU, NCCL on GPU): packed varlen "
            "batches, bf16 with fp32 master weights, reshardable checkpoints",
            target="rlweave_backend_deepspeed.worker:DeepSpeedWorker",
            config_model=DeepSpeedConfig,
            model_types=("causal_lm", "value", "reward"),
            parallel=("dp",),
            vision=True,  # Qwen2-VL models, images in Batch.mm (rlweave.backend_helpers.hf_model.vision)
            check=check_role,
            probe=probe,
        )
    ]
