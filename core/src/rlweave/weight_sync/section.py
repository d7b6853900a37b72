"""The ``weight_sync`` config section, beside the code it configures.

:class:`~rlweave.config.schema.RunConfig` holds it as ``weight_sync``; :class:`WeightSync
<rlweave.weight_sync.service.WeightSync>` falls back to its defaults when given none. Strict,
as every core section: an unknown key is an error.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class WeightSyncSection(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    transport: Literal["auto", "object_store", "broadcast", "cuda_ipc", "in_process"] = Field(
        "auto", description="How weights move between roles: object_store (Ray's object store, works everywhere), "
        "broadcast (a group between the source's rank 0 and the destination ranks: NCCL on GPU, gloo otherwise), "
        "cuda_ipc (memory handles between roles on one node: CUDA IPC on a shared GPU, shared memory on CPU), "
        "in_process (checksummed buckets handed over through the controller: roles of run.scheduler in_process); "
        "auto: in_process for roles in one process, cuda_ipc for colocated GPU roles, broadcast for other GPU roles, "
        "object_store otherwise.",
    )
    lora: Literal["merged", "adapter"] = Field(
        "merged", description="A policy that trains LoRA adapters: 'merged' sends the merged full weights through "
        "the transport; 'adapter' sends only the adapter, which the rollout engine applies itself (its engine must "
        "support it: vllm, hf), written under the run directory and checked by SHA-256.",
    )
    bucket_mb: float = Field(64.0, gt=0, description="Size of a weight bucket in MiB (a larger tensor travels alone).")
    timeout_s: Optional[float] = Field(
        None, gt=0, description="Seconds a whole sync may take; null: the destination's roles.<role>.timeouts.sync.",
    )
