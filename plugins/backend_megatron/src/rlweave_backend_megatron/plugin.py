"""Entry point module (light): registers the ``megatron`` training backend record."""

from __future__ import annotations

from rlweave.plugins import BackendRecord, hookimpl

from rlweave_backend_megatron import probe
from rlweave_backend_megatron.config import MegatronConfig


@hookimpl
def rlweave_training_backends() -> list[BackendRecord]:
    return [BackendRecord(
        name="megatron",
        summary="megatron-core TP/PP/DP training backend",
        target="rlweave_backend_megatron.worker:MegatronWorker",
        config_model=MegatronConfig,
        parallel=("dp", "tp", "pp"),
        probe=probe,
    )]
