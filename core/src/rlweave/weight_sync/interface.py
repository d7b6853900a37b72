"""Weight-sync contract: moving a trained role's weights into another role.

Policy -> rollout after each update (and policy -> reference/critic where an algorithm
says so). One interface, several transports:

* :class:`~rlweave.weight_sync.object_store.ObjectStoreTransport` (implemented): buckets go
  through Ray's object store; works on any cluster, CPU or GPU.
* :class:`~rlweave.weight_sync.broadcast.BroadcastTransport` (implemented, NCCL between CUDA
  ranks, gloo otherwise): a group between the source's rank 0 and the destination ranks,
  formed in :meth:`WeightTransport.setup`, buckets broadcast in place of object-store puts.
* :class:`~rlweave.weight_sync.cuda_ipc.CudaIpcTransport` (implemented): colocated roles
  pass memory handles of the buckets (CUDA IPC; shared memory on CPU) instead of bytes.
* :class:`~rlweave.weight_sync.in_process.InProcessTransport` (implemented): roles in the
  controller's process (``run.scheduler: in_process``) hand the buckets over in memory.

``weight_sync.transport: auto`` picks among them by where the roles run
(:mod:`rlweave.weight_sync.auto`).

Every transport honours the same rules, whatever moves the bytes:

Lifecycle (all on the controller): construct once per (source, destination) pair ->
:meth:`~WeightTransport.setup` once both roles are built -> :meth:`~WeightTransport.sync`
after every update -> :meth:`~WeightTransport.close` at the end (idempotent).

Data: all source ranks iterate ``named_weights()`` together (it may run collectives; only
rank 0 yields tensors). Tensors travel in buckets of about ``bucket_bytes`` (a tensor larger
than that travels alone), each with a checksum over its names, shapes, dtypes and bytes.
Every destination rank receives every bucket, verifies it, and streams the tensors into its
worker's ``load_weights(iterable of (name, tensor))``.

Timeout: a whole ``sync`` finishes within ``timeout_s`` or raises
:class:`WeightSyncTimeout` naming the role and ranks that did not answer. It never hangs.

Failure: a checksum mismatch raises :class:`WeightSyncError` naming the bucket and its
tensors; a worker exception raises it with role and rank (the
:class:`~rlweave.scheduler.WorkerError` as its cause). After a failed or timed-out sync the
destination's weights are undefined (some buckets may be loaded) and a rank that timed out
may still be busy: sync again, or shut the role down.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.scheduler.handle import RoleHandle


class WeightSyncError(RuntimeError):
    """A weight sync failed (corrupt bucket, worker error); the message says where."""


class WeightSyncTimeout(WeightSyncError, TimeoutError):
    """A weight sync did not finish within its timeout."""


def from_worker_error(exc: Any, where: str, note: str = "") -> WeightSyncError:
    """The :class:`WeightSyncError` for a ``WorkerError`` of a transport's rank-side end:
    ``"<where> rank <r><note>: <detail>"``, of the same type and with the message of the
    rank's own ``WeightSyncError`` when that is the cause (a corrupt bucket, a fetch
    timeout), else with the worker's summary. Raise it ``from exc``."""
    cause = exc.cause if isinstance(exc.cause, WeightSyncError) else None
    detail = str(cause) if cause is not None else exc.summary
    return (type(cause) if cause is not None else WeightSyncError)(f"{where} rank {exc.rank}{note}: {detail}")


class WeightTransport(ABC):
    """Moves weights from one role's ranks to another's (see the module contract)."""

    name: str = "abstract"

    def __init__(self, timeout_s: float = 900.0):
        #: how long a channel the transport holds open (e.g. a process group) may wait
        self.timeout_s = float(timeout_s)

    def setup(self, src: "RoleHandle", dst: "RoleHandle") -> None:
        """Prepare the channel once both roles run (e.g. form a broadcast group)."""

    @abstractmethod
    def sync(self, src: "RoleHandle", dst: "RoleHandle", bucket_bytes: int, timeout_s: float) -> dict[str, Any]:
        """Move the source's current weights into every destination rank.

        Returns stats: ``bytes`` (payload), ``tensors``, ``buckets``, ``seconds`` (wall
        time of the whole sync), ``bytes_per_s``."""

    def close(self) -> None:
        """Release what :meth:`setup` made (idempotent)."""
