"""Weight sync between roles: one interface, pluggable transports (light at import).

See :mod:`rlweave.weight_sync.interface` for the contract, :class:`WeightSync` for what
algorithms call (``ctx.weight_sync.sync("policy", "rollout")``), :func:`sync_weights` for one
sync between two role handles, :mod:`rlweave.weight_sync.object_store` for the transport that
works everywhere Ray runs, :mod:`~rlweave.weight_sync.broadcast` (gloo/NCCL group) and
:mod:`~rlweave.weight_sync.cuda_ipc` (memory handles between colocated roles) and
:mod:`~rlweave.weight_sync.in_process` (roles in the controller's process) for the others,
:mod:`~rlweave.weight_sync.auto` for what ``transport: auto`` picks. Transports own both ends:
their rank-side code reaches the ranks through the role handle's generic call; the scheduler
knows nothing of weight sync.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "WeightTransport": "rlweave.weight_sync.interface",
    "WeightSyncError": "rlweave.weight_sync.interface",
    "WeightSyncTimeout": "rlweave.weight_sync.interface",
    "BucketMeta": "rlweave.weight_sync.buckets",
    "iter_buckets": "rlweave.weight_sync.buckets",
    "verify_bucket": "rlweave.weight_sync.buckets",
    "unpack_bucket": "rlweave.weight_sync.buckets",
    "ObjectStoreTransport": "rlweave.weight_sync.object_store",
    "BroadcastTransport": "rlweave.weight_sync.broadcast",
    "CudaIpcTransport": "rlweave.weight_sync.cuda_ipc",
    "InProcessTransport": "rlweave.weight_sync.in_process",
    "pick_transport": "rlweave.weight_sync.auto",
    "sync_weights": "rlweave.weight_sync.sync",
    "WeightSync": "rlweave.weight_sync.service",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rlweave.weight_sync' has no attribute {name!r}")
