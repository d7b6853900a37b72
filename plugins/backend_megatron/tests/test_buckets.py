"""Bucketed collectives (:func:`rlweave_backend_megatron.buckets.coalesced`): every tensor gets
the collective's result for its own elements, buckets respect the byte limit and the dtype, and
a tensor larger than a bucket goes alone. The collective here is a local function recording the
buckets; the real ones (gloo all-reduce, reduce, broadcast) run in the dp=2 tests of
``test_megatron_cpu.py``."""

from __future__ import annotations

import torch
from rlweave_backend_megatron.buckets import coalesced


def test_buckets_split_by_size_and_dtype_and_write_back():
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(4, 3, generator=g), torch.randn(5, generator=g), torch.randn(2, 2, generator=g).double(),
               torch.randn(40, generator=g), torch.randn(3, generator=g)]
    before = [t.clone() for t in tensors]
    seen: list[tuple[int, torch.dtype]] = []

    def op(flat: torch.Tensor) -> None:
        seen.append((flat.numel(), flat.dtype))
        flat.mul_(2).add_(1)

    calls = coalesced(tensors, op, bucket_bytes=80)  # 20 fp32 values per bucket
    assert calls == len(seen) == 4
    # 12 + 5 fp32 together; the fp64 tensor alone (another dtype); 40 values over the limit alone; then 3
    assert seen == [(17, torch.float32), (4, torch.float64), (40, torch.float32), (3, torch.float32)]
    for t, b in zip(tensors, before):
        assert t.shape == b.shape and t.dtype == b.dtype
        assert torch.equal(t, b * 2 + 1)


def test_nothing_to_do_makes_no_call():
    assert coalesced([], lambda f: (_ for _ in ()).throw(AssertionError("called")), 10) == 0
