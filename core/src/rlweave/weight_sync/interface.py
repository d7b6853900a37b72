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

Version: ``sync``/``begin`` take the policy ``version`` of the weights; every destination
rank takes it (``set_weight_version``) as its load ends, inside the same step boundary on an
engine with a control plane (:mod:`rlweave.weight_sync.landing`), so no token is stamped with
the wrong version.

Control channel: the destination's rank-side ends (dtype query, receiving end) go through
the role's control channel (``submit_ranks(..., control=True)``): on an engine with a control
plane they never wait behind queued ``generate`` calls, and the load lands between two
decoding steps of a running one. The destination's ``weight_dtype()`` is asked once per
transport and destination (:func:`rlweave.weight_sync.dtype.dtype_for`).

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
from typing import TYPE_CHECKING, Any, Callable

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
    #: ``sync``/``begin`` take ``version`` and the destination takes it as its load ends (see
    #: the module contract); a transport without it gets the version set after its sync
    stamps_version: bool = False

    def __init__(self, timeout_s: float = 900.0):
        #: how long a channel the transport holds open (e.g. a process group) may wait
        self.timeout_s = float(timeout_s)

    def setup(self, src: "RoleHandle", dst: "RoleHandle") -> None:
        """Prepare the channel once both roles run (e.g. form a broadcast group)."""

    @abstractmethod
    def sync(self, src: "RoleHandle", dst: "RoleHandle", bucket_bytes: int, timeout_s: float,
             version: int | None = None) -> dict[str, Any]:
        """Move the source's current weights into every destination rank (which takes
        ``version`` when given, see :attr:`stamps_version`).

        Returns stats: ``bytes`` (payload), ``tensors``, ``buckets``, ``seconds`` (wall
        time of the whole sync), ``bytes_per_s``."""

    def begin(self, src: "RoleHandle", dst: "RoleHandle", bucket_bytes: int, timeout_s: float,
              queued_s: float = 0.0, version: int | None = None) -> Callable[[], dict[str, Any]]:
        """Start a sync without waiting for it; the returned function waits (once) and
        returns :meth:`sync`'s stats, raising its errors. ``queued_s``: how long the receiving
        end may wait behind calls queued on a destination without a control channel, on top
        of ``timeout_s``. Default: the whole sync runs here."""
        info = self.sync(src, dst, bucket_bytes, timeout_s, **({"version": version} if self.stamps_version else {}))
        return lambda: info

    def close(self) -> None:
        """Release what :meth:`setup` made (idempotent)."""
