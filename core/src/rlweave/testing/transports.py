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
    damaged = payload.clone() if hasattr(payload, "clone") else payload.copy()  # device tensor (NCCL) or numpy
    damaged[len(damaged) // 2] ^= 0x01
    return damaged


def flip_shared_bucket_1(meta: Any, flat: Any) -> None:
    """A ``tamper`` hook for :class:`~rlweave.weight_sync.cuda_ipc.CudaIpcTransport`: flips one
    bit of bucket 1's shared payload in place after its checksum was taken."""
    if meta.index == 1:
        flat[flat.numel() // 2] ^= 0x01


# --------------------------------------------- GPU test processes (spawned, so importable here)
def open_and_verify_child(meta: Any, handle: Any, q: Any) -> None:
    """Child process of the CUDA IPC test: open ``handle``, copy and verify the bucket, put
    ``"ok"`` (or the error) on ``q``."""
    from rlweave.weight_sync import device_buckets as db
    from rlweave.weight_sync.handles import open_handle

    try:
        own = open_handle(handle)[:meta.nbytes].clone()
        db.verify(meta, own)
        q.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        q.put(repr(exc))


class _CudaRank:
    """A rank worker on the current GPU: yields ``state``, keeps what it loads."""

    class ctx:  # noqa: N801 - stands for WorkerContext
        device = "cuda"

    def __init__(self, state: dict):
        self.state = state

    def named_weights(self) -> Any:
        yield from self.state.items()

    def load_weights(self, items: Any) -> None:
        self.state = {n: t.clone() for n, t in items}


def nccl_broadcast_rank(group_rank: int, port: int, megabytes: float, q: Any) -> None:
    """Process ``group_rank`` (0: source, 1: receiver) of the NCCL broadcast test on GPU
    ``group_rank``; puts ``("sent", stats)`` or ``("received", stats, equal)`` on ``q``."""
    import torch

    from rlweave.testing.workers import make_state_dict
    from rlweave.weight_sync import broadcast as b

    torch.cuda.set_device(group_rank)
    want = make_state_dict(megabytes, 3)
    worker = _CudaRank({n: t.cuda() for n, t in want.items()} if group_rank == 0 else {})
    try:
        b.join_end(worker, 0, "k", "127.0.0.1", port, group_rank, 2, 60, "nccl")
        if group_rank == 0:
            q.put(("sent", b.send_end(worker, 0, "k", 1 << 20, None)))
        else:
            got = b.receive_end(worker, 0, "k")
            same = all(worker.state[n].is_cuda and torch.equal(worker.state[n].cpu(), t) for n, t in want.items())
            q.put(("received", got, same))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        q.put(("error", repr(exc)))
