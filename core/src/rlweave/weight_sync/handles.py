"""Memory handles: a small picklable description of a flat ``uint8`` tensor another process
on the same node maps without copying it.

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

import os
from typing import TYPE_CHECKING

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
