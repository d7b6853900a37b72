"""Weight-sync test helpers: tamper hooks that damage a bucket after its checksum was taken,
and the processes of the GPU transport tests (spawned, so they must be importable).
"""

from __future__ import annotations

from typing import Any


def flip_bucket_1(meta: Any, payload: Any) -> Any:
    """A ``tamper`` hook for :class:`~rlweave.weight_sync.broadcast.BroadcastTransport` and
    :class:`~rlweave.weight_sync.in_process.InProcessTransport`: bucket 1's payload with one bit flipped after its checksum was taken (the others unchanged)."""
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
