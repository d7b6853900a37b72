"""A weight transport for tests of algorithms on in-process worker groups.

:class:`InProcessTransport` moves weights with the same generic rank calls a real transport
uses (``submit_ranks(..., fn=...)``), but hands tensors over in this process instead of
through Ray's object store, so it works on :class:`~rlweave.scheduler.local.LocalWorkerGroup`
roles. Use it as ``WeightSync(roles, transport_factory=lambda src, dst: InProcessTransport())``.
"""

from __future__ import annotations

import time
from typing import Any

from rlweave.weight_sync.interface import WeightTransport


def _send_end(worker: Any, rank: int) -> list:
    """Rank 0's ``(name, tensor copy)`` list; every rank iterates (it may run collectives)."""
    items = [(name, t.detach().clone()) for name, t in worker.named_weights()]
    return items if rank == 0 else []


def _receive_end(worker: Any, rank: int, items: list) -> int:  # noqa: ARG001
    worker.load_weights(iter(items))
    return len(items)


class InProcessTransport(WeightTransport):
    """Weights between in-process roles. ``setups``, ``syncs`` and ``closed`` record its use."""

    name = "in_process"

    def __init__(self) -> None:
        self.setups = 0
        self.syncs = 0
        self.closed = False

    def setup(self, src: Any, dst: Any) -> None:
        self.setups += 1

    def sync(self, src: Any, dst: Any, bucket_bytes: int, timeout_s: float) -> dict[str, Any]:
        start = time.monotonic()
        src_ranks, dst_ranks = list(range(src.world_size)), list(range(dst.world_size))
        items = src.submit_ranks("send_weights", src_ranks, [((), {})] * len(src_ranks), lambda v: v[0],
                                 fn=_send_end).result(timeout=timeout_s)
        dst.submit_ranks("receive_weights", dst_ranks, [((items,), {})] * len(dst_ranks), list,
                         fn=_receive_end).result(timeout=timeout_s)
        self.syncs += 1
        nbytes = sum(t.numel() * t.element_size() for _, t in items)
        return {"bytes": nbytes, "tensors": len(items), "buckets": 1, "seconds": time.monotonic() - start}

    def close(self) -> None:
        self.closed = True


def flip_bucket_1(meta: Any, payload: Any) -> Any:
    """A ``tamper`` hook for :class:`~rlweave.weight_sync.broadcast.BroadcastTransport`: bucket
    1's payload with one bit flipped after its checksum was taken (the others unchanged)."""
    if meta.index != 1:
        return payload
    damaged = payload.copy()
    damaged[len(damaged) // 2] ^= 0x01
    return damaged
