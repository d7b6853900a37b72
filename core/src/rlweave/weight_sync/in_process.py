"""In-process transport: checksummed buckets handed over through the controller's memory.

Meant for roles whose ranks run in the controller process (``run.scheduler: in_process``,
:mod:`rlweave.scheduler.in_process`), where no object store or process group is there to
carry them; ``weight_sync.transport: auto`` picks it when every destination rank runs in the
source rank 0's process. With Ray actors it works too, the buckets then passing through the
controller as call results and arguments.

Controller side (:class:`InProcessTransport`): every source rank runs :func:`send_end`
(rank 0 returns ``[(BucketMeta, payload), ...]``, floating tensors in the destination's
``weight_dtype()``), then every destination rank runs :func:`receive_end` on that list, which
verifies each bucket's checksum before its tensors reach ``load_weights``.

Memory and speed: the payloads are CPU buffers (:func:`~rlweave.weight_sync.buckets.iter_buckets`
copies device tensors to the host), all of a sync's buckets at once: the whole model once more in
host memory, and on a GPU a device -> host -> device round trip.

Timeout: the calls of roles in this process run to their end when submitted (nothing can cut
them short), so a sync that ran past ``timeout_s`` raises
:class:`~rlweave.weight_sync.interface.WeightSyncTimeout` when it ends, with the destination's
weights then undefined as after any failed sync; with Ray actors the deadline is enforced as
the calls run.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from rlweave.weight_sync.buckets import BucketMeta, cast_floating, iter_buckets, unpack_bucket
from rlweave.weight_sync.dtype import dtype_for
from rlweave.weight_sync.interface import WeightSyncError, WeightSyncTimeout, WeightTransport, from_worker_error

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.scheduler.handle import RoleHandle

#: ``tamper(meta, payload) -> payload``: a test hook applied to each bucket after its checksum
Tamper = Callable[[BucketMeta, Any], Any]


# ----------------------------------------------------------------- rank side
def send_end(worker: Any, rank: int, bucket_bytes: int, dtype: str | None = None,
             tamper: Tamper | None = None) -> list[tuple[BucketMeta, Any]]:
    """Sending end, on every source rank: iterate ``named_weights()`` to the end (all ranks:
    it may run collectives); rank 0 returns its checksummed buckets, other ranks ``[]``."""
    named = cast_floating(worker.named_weights(), dtype)
    if rank != 0:
        for _ in named:
            pass
        return []
    out = []
    for meta, payload in iter_buckets(named, bucket_bytes):
        out.append((meta, tamper(meta, payload) if tamper is not None else payload))
    return out


def receive_end(worker: Any, rank: int, buckets: list[tuple[BucketMeta, Any]],  # noqa: ARG001
                version: int | None = None) -> dict[str, int]:
    """Receiving end, on every destination rank: verify each bucket (a mismatch raises
    :class:`WeightSyncError` naming the bucket and its tensors) and stream its tensors into
    ``worker.load_weights`` (landing as :mod:`rlweave.weight_sync.landing` says, the worker
    taking ``version``); returns ``buckets``, ``bytes``, ``tensors`` loaded."""
    from rlweave.weight_sync.landing import landing

    load = getattr(worker, "load_weights", None)
    if load is None:
        raise WeightSyncError(f"{type(worker).__name__} has no load_weights(); it cannot receive weights")
    stats = {"buckets": 0, "bytes": 0, "tensors": 0}

    def tensors():
        for meta, payload in buckets:
            items = unpack_bucket(meta, payload, "receiver")
            stats["buckets"] += 1
            stats["bytes"] += meta.nbytes
            stats["tensors"] += len(items)
            yield from items

    with landing(worker, version):
        load(tensors())
    if stats["buckets"] != len(buckets):
        raise WeightSyncError(
            f"load_weights() of {type(worker).__name__} stopped after {stats['buckets']} of {len(buckets)} buckets")
    return stats


# ------------------------------------------------------------- controller side
class InProcessTransport(WeightTransport):
    """Weights through the controller (see the module docstring and
    :mod:`rlweave.weight_sync.interface` for the contract). ``syncs``: syncs completed.
    ``tamper``: for tests, see :func:`send_end`."""

    name = "in_process"
    stamps_version = True

    def __init__(self, timeout_s: float = 900.0, tamper: Tamper | None = None):
        super().__init__(timeout_s)
        self.tamper = tamper
        self.syncs = 0

    def sync(self, src: "RoleHandle", dst: "RoleHandle", bucket_bytes: int, timeout_s: float,
             version: int | None = None) -> dict[str, Any]:
        from rlweave.worker_errors import WorkerError, WorkerTimeout

        start = time.monotonic()
        dtype = dtype_for(self, dst, timeout_s)
        src_ranks, dst_ranks = list(range(src.world_size)), list(range(dst.world_size))
        try:
            sent = src.submit_ranks("send_weights", src_ranks, [((bucket_bytes, dtype, self.tamper), {})] * len(
                src_ranks), lambda v: v[0], fn=send_end).result(timeout=self._left(start, timeout_s))
        except WorkerTimeout as exc:
            raise WeightSyncTimeout(f"weight sync from {src.name!r}: rank(s) {', '.join(map(str, exc.ranks))} did "
                                    f"not finish named_weights() within {timeout_s:g} s") from None
        except WorkerError as exc:
            raise WeightSyncError(f"weight sync from {src.name!r} rank {exc.rank}: sending failed: {exc.summary}") \
                from exc
        try:
            dst.submit_ranks("receive_weights", dst_ranks, [((sent, version), {})] * len(dst_ranks), list,
                             fn=receive_end, control=True).result(timeout=self._left(start, timeout_s))
        except WorkerTimeout as exc:
            raise WeightSyncTimeout(f"weight sync into {dst.name!r}: rank(s) {', '.join(map(str, exc.ranks))} did "
                                    f"not answer within {timeout_s:g} s") from None
        except WorkerError as exc:
            raise from_worker_error(exc, f"weight sync into {dst.name!r}") from exc
        seconds = time.monotonic() - start
        if seconds > timeout_s:
            raise WeightSyncTimeout(f"weight sync {src.name!r} -> {dst.name!r} took {seconds:.1f} s, more than its "
                                    f"{timeout_s:g} s timeout (weight_sync.timeout_s, else roles.{dst.name}.timeouts."
                                    "sync); in process it could only be reported once it had ended")
        self.syncs += 1
        nbytes = sum(m.nbytes for m, _ in sent)
        return {"bytes": nbytes, "tensors": sum(len(m.names) for m, _ in sent), "buckets": len(sent),
                "seconds": seconds, "bytes_per_s": nbytes / seconds if seconds > 0 else float("inf"), "dtype": dtype}

    @staticmethod
    def _left(start: float, timeout_s: float) -> float:
        return max(0.0, start + timeout_s - time.monotonic())
