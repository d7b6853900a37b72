"""Bucketing: named tensors <-> flat, checksummed byte payloads.

A bucket is a :class:`BucketMeta` (index, names, shapes, dtypes, byte offsets, checksum)
plus one flat ``numpy.uint8`` payload (numpy so Ray's object store hands it out without a
copy). The checksum (XXH3, 128 bit: made to catch corruption, not forgery, and much cheaper
than a cryptographic hash: bench/RESULTS.md) covers the header and the payload, so a wrong
name/shape as much as a flipped byte is caught by :func:`unpack_bucket`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import xxhash

from rlweave.weight_sync.interface import WeightSyncError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch


ALIGN = 16  # bytes; tensor starts inside a payload are multiples of this


@dataclass(frozen=True)
class BucketMeta:
    index: int
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    offsets: tuple[int, ...]  # start of each tensor in the payload
    nbytes: int
    checksum: str

    def describe(self, limit: int = 6) -> str:
        shown = ", ".join(self.names[:limit])
        more = f" (+{len(self.names) - limit} more)" if len(self.names) > limit else ""
        return f"bucket {self.index} [{shown}{more}]"


def _header(index: int, names, shapes, dtypes, offsets, nbytes) -> bytes:
    return json.dumps([index, list(names), [list(s) for s in shapes], list(dtypes), list(offsets), nbytes]).encode()


def checksum(header: bytes, payload: Any) -> str:
    h = xxhash.xxh3_128()
    h.update(header)
    h.update(memoryview(payload).cast("B"))
    return h.hexdigest()


def _dtype_name(dtype: "torch.dtype") -> str:
    return str(dtype).removeprefix("torch.")


def _seal(index: int, items: list[tuple[str, "torch.Tensor"]]) -> tuple[BucketMeta, "np.ndarray"]:
    import numpy as np
    import torch

    sizes = [t.numel() * t.element_size() for _, t in items]
    offsets, pos = [], 0
    for n in sizes:
        offsets.append(pos)
        pos += -(-n // ALIGN) * ALIGN  # aligned starts: each slice can be viewed as its dtype
    payload = np.zeros(pos, dtype=np.uint8)
    flat = torch.from_numpy(payload)
    for (_, t), off, n in zip(items, offsets, sizes):
        if n:
            flat[off:off + n].copy_(t.reshape(-1).view(torch.uint8))
    names = tuple(n for n, _ in items)
    shapes = tuple(tuple(t.shape) for _, t in items)
    dtypes = tuple(_dtype_name(t.dtype) for _, t in items)
    head = _header(index, names, shapes, dtypes, offsets, pos)
    return BucketMeta(index, names, shapes, dtypes, tuple(offsets), pos, checksum(head, payload)), payload


def cast_floating(
    named_tensors: Iterable[tuple[str, "torch.Tensor"]], dtype: str | None
) -> Iterator[tuple[str, "torch.Tensor"]]:
    """``named_tensors`` with every floating-point tensor cast to ``dtype`` (a torch dtype
    name; None: unchanged). Integer and bool tensors pass as they are."""
    if dtype is None:
        yield from named_tensors
        return
    import torch

    dt = getattr(torch, dtype, None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise ValueError(f"weight sync: {dtype!r} is not a floating-point torch dtype")
    for name, t in named_tensors:
        yield name, (t.to(dt) if t.is_floating_point() else t)


def iter_buckets(
    named_tensors: Iterable[tuple[str, "torch.Tensor"]], bucket_bytes: int
) -> Iterator[tuple[BucketMeta, "np.ndarray"]]:
    """Group tensors (in order) into buckets of at most ``bucket_bytes`` (a larger tensor
    gets a bucket of its own). Only one bucket's tensors are held at a time."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    items: list[tuple[str, "torch.Tensor"]] = []
    size, index = 0, 0
    for name, tensor in named_tensors:
        t = tensor.detach().to("cpu").contiguous()
        n = t.numel() * t.element_size()
        if items and size + n > bucket_bytes:
            yield _seal(index, items)
            index += 1
            items, size = [], 0
        items.append((name, t))
        size += -(-n // ALIGN) * ALIGN
    if items:
        yield _seal(index, items)


def verify_bucket(meta: BucketMeta, payload: Any, where: str = "") -> None:
    """Raise :class:`WeightSyncError` naming the bucket and its tensors when the payload
    does not match the checksum taken by the sender."""
    size = memoryview(payload).nbytes
    head = _header(meta.index, meta.names, meta.shapes, meta.dtypes, meta.offsets, meta.nbytes)
    got = checksum(head, payload) if size == meta.nbytes else f"<{size} bytes, expected {meta.nbytes}>"
    if got != meta.checksum:
        prefix = f"{where}: " if where else ""
        raise WeightSyncError(
            f"{prefix}{meta.describe()} failed verification: checksum {got} != sent {meta.checksum}; "
            f"tensors: {', '.join(meta.names)}"
        )


def unpack_bucket(meta: BucketMeta, payload: Any, where: str = "") -> list[tuple[str, "torch.Tensor"]]:
    """Verify, then return fresh (writable, owned) tensors of the bucket."""
    import numpy as np
    import torch

    verify_bucket(meta, payload, where)
    data = torch.from_numpy(np.array(payload, dtype=np.uint8, copy=True))
    out = []
    for name, shape, dtype, off in zip(meta.names, meta.shapes, meta.dtypes, meta.offsets):
        dt = getattr(torch, dtype)
        n = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dt).element_size()
        out.append((name, data[off:off + n].view(dt).reshape(shape)))
    return out
