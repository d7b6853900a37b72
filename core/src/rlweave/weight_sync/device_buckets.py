"""Buckets packed into one flat ``uint8`` torch tensor on a device (CPU or CUDA).

The same layout as :mod:`rlweave.weight_sync.buckets` (tensors in order, starts aligned to
:data:`~rlweave.weight_sync.buckets.ALIGN` bytes, the same :class:`BucketMeta`), but the
payload is a torch tensor the caller provides (a shared-memory or device buffer), so
transports that keep the bytes on the device (CUDA IPC, NCCL broadcast) never copy them to
the host.

Checksum (:func:`payload_checksum`): on CPU the XXH3 of :func:`buckets.checksum` (a CPU
bucket packed here has the same meta as one from :func:`~rlweave.weight_sync.buckets.iter_buckets`);
on CUDA a position-weighted sum over the payload's 64-bit words computed on the device
(``"dev:"`` prefix: it catches flipped bits and moved words, not forgery), so verifying a
bucket never moves its payload to the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from rlweave.weight_sync.buckets import ALIGN, BucketMeta, _dtype_name, _header, checksum
from rlweave.weight_sync.interface import WeightSyncError

if TYPE_CHECKING:  # pragma: no cover
    import torch

_CHUNK = 1 << 24  # 64-bit words per step of the device checksum (128 MiB of payload)
_MIX = 0x9E3779B97F4A7C15 - (1 << 64)  # odd 64-bit constant (signed), mixes the word index


def group(named: Iterable[tuple[str, "torch.Tensor"]], bucket_bytes: int) -> Iterator[list[tuple[str, "torch.Tensor"]]]:
    """Tensors (in order, detached, contiguous, on their own device) grouped by the rule of
    :func:`~rlweave.weight_sync.buckets.iter_buckets`: at most ``bucket_bytes`` a bucket, a
    larger tensor alone."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    items: list = []
    size = 0
    for name, tensor in named:
        t = tensor.detach().contiguous()
        n = t.numel() * t.element_size()
        if items and size + n > bucket_bytes:
            yield items
            items, size = [], 0
        items.append((name, t))
        size += -(-n // ALIGN) * ALIGN
    if items:
        yield items


def packed_size(items: list[tuple[str, "torch.Tensor"]]) -> int:
    """Bytes of the payload :func:`pack` writes for ``items`` (alignment included)."""
    return sum(-(-(t.numel() * t.element_size()) // ALIGN) * ALIGN for _, t in items)


def payload_checksum(header: bytes, flat: "torch.Tensor") -> str:
    """Checksum of a bucket's header and its payload ``flat`` (uint8, length a multiple of
    :data:`ALIGN`); see the module docstring."""
    if flat.device.type == "cpu":
        return checksum(header, flat.numpy())
    return device_checksum(header, flat)


def device_checksum(header: bytes, flat: "torch.Tensor") -> str:
    """The CUDA buckets' checksum (see the module docstring), computed where ``flat`` lives
    (any device; the same value for the same bytes)."""
    import torch

    words = flat.view(torch.int64)
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    plain = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, words.numel(), _CHUNK):
        part = words[start:start + _CHUNK]
        idx = torch.arange(start + 1, start + 1 + part.numel(), dtype=torch.int64, device=flat.device)
        total += (part * (idx * _MIX)).sum()  # int64 arithmetic wraps: a sum modulo 2**64
        plain += part.sum()
    mask = 2**64 - 1
    return f"dev:{checksum(header, memoryview(b''))[:16]}:{int(total) & mask:016x}:{int(plain) & mask:016x}"


def pack(index: int, items: list[tuple[str, "torch.Tensor"]],
         buffer: Callable[[int], "torch.Tensor"]) -> tuple[BucketMeta, "torch.Tensor"]:
    """Copy ``items`` into ``buffer(nbytes)[:nbytes]`` (a uint8 tensor the caller owns, on the
    bucket's device) and return the bucket's meta and that payload view."""
    import torch

    nbytes = packed_size(items)
    flat = buffer(nbytes)[:nbytes]
    offsets, pos = [], 0
    for _, t in items:
        n = t.numel() * t.element_size()
        offsets.append(pos)
        if n:
            flat[pos:pos + n].copy_(t.reshape(-1).view(torch.uint8), non_blocking=True)
        end = pos + -(-n // ALIGN) * ALIGN
        if end > pos + n:
            flat[pos + n:end].zero_()
        pos = end
    names = tuple(n for n, _ in items)
    shapes = tuple(tuple(t.shape) for _, t in items)
    dtypes = tuple(_dtype_name(t.dtype) for _, t in items)
    head = _header(index, names, shapes, dtypes, offsets, nbytes)
    return BucketMeta(index, names, shapes, dtypes, tuple(offsets), nbytes, payload_checksum(head, flat)), flat


def verify(meta: BucketMeta, flat: "torch.Tensor", where: str = "") -> None:
    """Raise :class:`WeightSyncError` naming the bucket and its tensors when ``flat`` does
    not match the sender's checksum."""
    head = _header(meta.index, meta.names, meta.shapes, meta.dtypes, meta.offsets, meta.nbytes)
    size = flat.numel()
    got = payload_checksum(head, flat) if size == meta.nbytes else f"<{size} bytes, expected {meta.nbytes}>"
    if got != meta.checksum:
        prefix = f"{where}: " if where else ""
        raise WeightSyncError(f"{prefix}{meta.describe()} failed verification: checksum {got} != sent "
                              f"{meta.checksum}; tensors: {', '.join(meta.names)}")


def views(meta: BucketMeta, flat: "torch.Tensor") -> list[tuple[str, "torch.Tensor"]]:
    """The bucket's tensors as views of ``flat`` (no copy, no check)."""
    import torch

    out = []
    for name, shape, dtype, off in zip(meta.names, meta.shapes, meta.dtypes, meta.offsets):
        dt = getattr(torch, dtype)
        n = torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size()
        out.append((name, flat[off:off + n].view(dt).reshape(shape)))
    return out
