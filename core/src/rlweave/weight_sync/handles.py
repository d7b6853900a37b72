"""Memory handles: a small description of a flat ``uint8`` tensor another process on the same
node maps without copying it, sent as JSON (:func:`handle_to_json` / :func:`handle_from_json`:
plain numbers, strings and base64 bytes, never a pickle, so whoever can write to the channel
cannot make a rank run code).

* CUDA: torch's CUDA IPC reduction (:func:`torch.multiprocessing.reductions.reduce_tensor`:
  a ``cudaIpcMemHandle`` plus torch's producer reference counter and a CUDA event the opener
  waits on), with the device named by UUID: Ray gives each process its own
  ``CUDA_VISIBLE_DEVICES``, so the opener maps the UUID to its own device index.
* CPU: a shared-memory storage (``share_memory_()``, torch's file-descriptor strategy) named
  by ``(pid, fd)``; the opener maps ``/proc/<pid>/fd/<fd>``. Like a CUDA IPC handle it is valid
  while the owning process keeps the tensor, and nothing is left behind when that process
  ends. (torch's own CPU reductions pass the descriptor over multiprocessing's resource
  sharer, which only related processes can use.)

The owner must keep the tensor alive and unchanged until every opener is done with it.
"""

from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING, Any

from rlweave.weight_sync.interface import WeightSyncError

if TYPE_CHECKING:  # pragma: no cover
    import torch


def new_buffer(nbytes: int, device: "torch.device | str") -> "torch.Tensor":
    """A uint8 tensor of ``nbytes`` that :func:`share` can describe (shared memory on CPU)."""
    import torch

    t = torch.empty(max(1, nbytes), dtype=torch.uint8, device=device)
    return t.share_memory_() if t.device.type == "cpu" else t


def device_uuid(index: int) -> str:
    import torch

    return str(torch.cuda.get_device_properties(index).uuid)


def share(t: "torch.Tensor") -> tuple:
    """A handle of ``t`` (a contiguous uint8 tensor from :func:`new_buffer`)."""
    if t.device.type == "cuda":
        from torch.multiprocessing.reductions import reduce_tensor

        _rebuild, args = reduce_tensor(t)
        return ("cuda", device_uuid(t.device.index), args)
    if not t.is_shared():
        raise WeightSyncError("a CPU tensor must be in shared memory (share_memory_()) to be shared by handle")
    fd, size = t.untyped_storage()._share_fd_cpu_()
    return ("cpu", os.getpid(), int(fd), int(size), t.storage_offset(), t.numel())


def visible_uuids() -> list[str]:
    """UUIDs of the CUDA devices this process sees, in index order (empty without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [device_uuid(i) for i in range(torch.cuda.device_count())]


def open_handle(handle: tuple) -> "torch.Tensor":
    """The tensor a :func:`share` handle describes, mapped into this process (no copy).
    Raises :class:`WeightSyncError` when this process cannot reach it (other node, the owner
    gone, a device it does not see)."""
    import torch

    kind = handle[0]
    if kind == "cpu":
        _, pid, fd, size, offset, numel = handle
        try:
            storage = torch.from_file(f"/proc/{pid}/fd/{fd}", shared=False, size=size, dtype=torch.uint8)
        except (OSError, RuntimeError) as exc:
            raise WeightSyncError(f"cannot map shared memory of process {pid} (fd {fd}): {exc}; both ends must run "
                                  "on one node and the sender must still hold the bucket") from None
        return storage[offset:offset + numel]
    if kind == "cuda":
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        _, uuid, args = handle
        uuids = visible_uuids()
        if uuid not in uuids:
            raise WeightSyncError(f"the bucket lives on GPU {uuid}, which this process does not see (visible: "
                                  f"{', '.join(uuids) or 'none'}); cuda_ipc needs each receiver to see the "
                                  "sender's GPU")
        args = list(args)
        args[6] = uuids.index(uuid)  # the owner's device index -> this process's index of the same GPU
        return rebuild_cuda_tensor(*args)
    raise WeightSyncError(f"unknown memory handle kind {kind!r}")


#: the classes a CUDA handle may name (what :func:`share` produces for a plain uint8 tensor)
_TENSOR_CLASSES = ("torch.Tensor",)
_STORAGE_CLASSES = ("torch.storage.TypedStorage", "torch.storage.UntypedStorage", "torch.TypedStorage",
                    "torch.UntypedStorage")


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def handle_to_json(handle: tuple) -> dict[str, Any]:
    """A :func:`share` handle as JSON-ready data (CUDA: torch's reduction arguments with its
    classes and dtype named and its IPC handles base64-encoded)."""
    if handle[0] == "cpu":
        _, pid, fd, size, offset, numel = handle
        return {"kind": "cpu", "pid": int(pid), "fd": int(fd), "size": int(size), "offset": int(offset),
                "numel": int(numel)}
    if handle[0] == "cuda":
        _, uuid, args = handle
        (tensor_cls, size, stride, offset, storage_cls, dtype, device, storage_handle, storage_bytes,
         storage_offset, requires_grad, ref_handle, ref_offset, event_handle, event_sync) = args
        b64 = (lambda b: None if b is None else base64.b64encode(bytes(b)).decode("ascii"))
        return {"kind": "cuda", "uuid": str(uuid), "tensor_cls": _qualname(tensor_cls), "size": list(size),
                "stride": list(stride), "offset": int(offset), "storage_cls": _qualname(storage_cls),
                "dtype": str(dtype).removeprefix("torch."), "device": int(device),
                "storage_handle": b64(storage_handle), "storage_bytes": int(storage_bytes),
                "storage_offset": int(storage_offset), "requires_grad": bool(requires_grad),
                "ref_handle": b64(ref_handle), "ref_offset": int(ref_offset), "event_handle": b64(event_handle),
                "event_sync": bool(event_sync)}
    raise WeightSyncError(f"unknown memory handle kind {handle[0]!r}")


def handle_from_json(data: dict[str, Any]) -> tuple:
    """The handle :func:`handle_to_json` described; refuses classes and dtypes a bucket buffer
    never has (a CUDA handle names ``torch.Tensor``, a torch storage class and ``uint8``)."""
    kind = data.get("kind")
    if kind == "cpu":
        return ("cpu", int(data["pid"]), int(data["fd"]), int(data["size"]), int(data["offset"]),
                int(data["numel"]))
    if kind == "cuda":
        import torch

        if data["tensor_cls"] not in _TENSOR_CLASSES or data["storage_cls"] not in _STORAGE_CLASSES \
                or data["dtype"] != "uint8":
            raise WeightSyncError(f"refusing a CUDA handle of {data['tensor_cls']}/{data['storage_cls']}/"
                                  f"{data['dtype']}: bucket buffers are uint8 torch tensors")
        module, _, name = data["storage_cls"].rpartition(".")
        storage_cls = getattr(torch.storage if module == "torch.storage" else torch, name)
        raw = (lambda s: None if s is None else base64.b64decode(s))
        args = (torch.Tensor, torch.Size(data["size"]), tuple(data["stride"]), int(data["offset"]), storage_cls,
                torch.uint8, int(data["device"]), raw(data["storage_handle"]), int(data["storage_bytes"]),
                int(data["storage_offset"]), bool(data["requires_grad"]), raw(data["ref_handle"]),
                int(data["ref_offset"]), raw(data["event_handle"]), bool(data["event_sync"]))
        return ("cuda", str(data["uuid"]), args)
    raise WeightSyncError(f"unknown memory handle kind {kind!r}")
