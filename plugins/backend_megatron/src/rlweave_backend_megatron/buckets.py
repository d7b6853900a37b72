"""Collectives over many tensors in few calls: consecutive tensors of one dtype are copied into
a flat bucket of at most ``bucket_bytes`` (one tensor larger than that is a bucket of its own),
the collective runs once per bucket, and the results are copied back into the tensors.

The data-parallel gradient sums and the sharded optimizer's broadcasts (:mod:`.zero`) go through
:func:`coalesced`: per-tensor calls cost a launch and a round trip each, which for a model of
hundreds of tensors dominates the transfer itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def coalesced(tensors: Iterable[torch.Tensor], op: Callable[[torch.Tensor], None], bucket_bytes: int) -> int:
    """``op(flat)`` in place on buckets of ``tensors`` (in their order), each tensor then set
    from its part of the bucket; returns the number of buckets (calls of ``op``)."""
    bucket: list[torch.Tensor] = []
    size, calls = 0, 0

    def flush() -> None:
        nonlocal calls
        flat = torch.cat([t.reshape(-1) for t in bucket])
        op(flat)
        off = 0
        for t in bucket:
            n = t.numel()
            t.copy_(flat[off:off + n].view_as(t))
            off += n
        calls += 1

    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and (t.dtype != bucket[0].dtype or t.device != bucket[0].device or size + nbytes > bucket_bytes):
            flush()
            bucket, size = [], 0
        bucket.append(t)
        size += nbytes
    if bucket:
        flush()
    return calls
