"""Broadcast transport: buckets go from the source's rank 0 to every destination rank over a
torch.distributed group of their own (gloo).

:meth:`BroadcastTransport.setup` forms the group once per (source, destination) pair: source
rank 0 (group rank 0, which also hosts the group's ``TCPStore``) and destination ranks
``0..m-1`` (group ranks ``1..m``). The group is separate from each role's own process group
and lives in the rank processes until :meth:`~BroadcastTransport.close`.

A sync runs both ends at once. Every source rank iterates ``named_weights()`` (it may run
collectives; only rank 0 yields tensors). Source rank 0 packs the same checksummed buckets as
the object store (:mod:`rlweave.weight_sync.buckets`) and broadcasts each as three messages:
the lengths ``[header bytes, payload bytes]``, the JSON header (names, shapes, dtypes, offsets,
checksum), the payload; ``[-1, -1]`` ends the sync. Destination ranks verify each bucket and
stream its tensors into ``load_weights``. Nothing goes through the controller or Ray's object
store, and the source holds one bucket at a time. A destination that finds a corrupt bucket
keeps receiving to the end marker (so the group stays in step) and then fails naming the
bucket. The group's operations time out after the sync timeout given at ``setup``.

Gloo moves CPU tensors; on GPU the payload makes a host round trip (an NCCL group is not
implemented yet).
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterator

from rlweave.weight_sync.buckets import BucketMeta, cast_floating, iter_buckets, unpack_bucket
from rlweave.weight_sync.interface import WeightSyncError, WeightSyncTimeout, WeightTransport, from_worker_error
from rlweave.weight_sync.object_store import destination_dtype

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from rlweave.scheduler.handle import RoleHandle

#: rank-process registry: group key -> (store, process group)
_GROUPS: dict[str, tuple[Any, Any]] = {}
_END = (-1, -1)


# ----------------------------------------------------------------- rank side
def join_end(worker: Any, rank: int, key: str, host: str, port: int, group_rank: int, world: int,  # noqa: ARG001
             timeout_s: float) -> int:
    """Join group ``key`` as ``group_rank`` of ``world`` (group rank 0 hosts the store)."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world, is_master=group_rank == 0, timeout=timeout,
                          wait_for_workers=False)
    _GROUPS[key] = (store, dist.ProcessGroupGloo(dist.PrefixStore(key, store), group_rank, world, timeout))
    return group_rank


def leave_end(worker: Any, rank: int, key: str) -> bool:  # noqa: ARG001
    """Drop group ``key`` in this process (idempotent)."""
    return _GROUPS.pop(key, None) is not None


def _group(key: str) -> Any:
    if key not in _GROUPS:
        raise WeightSyncError(f"broadcast group {key} is not set up in this process (setup() not called, or closed)")
    return _GROUPS[key][1]


def _bcast(pg: Any, tensor: "torch.Tensor") -> "torch.Tensor":
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    pg.broadcast([tensor], opts).wait()
    return tensor


def send_end(worker: Any, rank: int, key: str, bucket_bytes: int, dtype: str | None,
             tamper: Callable[[BucketMeta, Any], Any] | None = None) -> dict[str, int]:
    """Sending end, on every source rank (only rank 0 is in the group). ``tamper(meta,
    payload)`` changes a payload after its checksum was taken (tests of corruption)."""
    import torch

    named = cast_floating(worker.named_weights(), dtype)
    if rank != 0:
        for _ in named:
            pass
        return {}
    pg = _group(key)
    stats = {"buckets": 0, "bytes": 0, "tensors": 0}
    for meta, payload in iter_buckets(named, bucket_bytes):
        header = json.dumps({"index": meta.index, "names": meta.names, "shapes": meta.shapes,
                             "dtypes": meta.dtypes, "offsets": meta.offsets, "nbytes": meta.nbytes,
                             "checksum": meta.checksum}).encode()
        if tamper is not None:
            payload = tamper(meta, payload)
        _bcast(pg, torch.tensor([len(header), meta.nbytes], dtype=torch.int64))
        _bcast(pg, torch.frombuffer(bytearray(header), dtype=torch.uint8))
        _bcast(pg, torch.from_numpy(payload))
        stats["buckets"] += 1
        stats["bytes"] += meta.nbytes
        stats["tensors"] += len(meta.names)
    _bcast(pg, torch.tensor(_END, dtype=torch.int64))
    return stats


def _meta(header: bytes) -> BucketMeta:
    d = json.loads(header)
    return BucketMeta(int(d["index"]), tuple(d["names"]), tuple(tuple(s) for s in d["shapes"]), tuple(d["dtypes"]),
                      tuple(d["offsets"]), int(d["nbytes"]), str(d["checksum"]))


def _buckets(pg: Any) -> Iterator[tuple[BucketMeta, Any]]:
    import torch

    while True:
        lengths = _bcast(pg, torch.empty(2, dtype=torch.int64)).tolist()
        if tuple(lengths) == _END:
            return
        header = _bcast(pg, torch.empty(lengths[0], dtype=torch.uint8))
        payload = _bcast(pg, torch.empty(lengths[1], dtype=torch.uint8))
        yield _meta(header.numpy().tobytes()), payload.numpy()


def receive_end(worker: Any, rank: int, key: str) -> dict[str, int]:  # noqa: ARG001
    """Receiving end, on every destination rank: verify each bucket and stream it into
    ``worker.load_weights``; drain to the end marker before raising on a bad bucket."""
    load = getattr(worker, "load_weights", None)
    if load is None:
        raise WeightSyncError(f"{type(worker).__name__} has no load_weights(); it cannot receive weights")
    incoming = _buckets(_group(key))
    stats = {"buckets": 0, "bytes": 0, "tensors": 0}
    drained = 0

    def tensors() -> Iterator[tuple[str, Any]]:
        for meta, payload in incoming:
            items = unpack_bucket(meta, payload, "receiver")
            stats["buckets"] += 1
            stats["bytes"] += meta.nbytes
            stats["tensors"] += len(items)
            yield from items

    try:
        load(tensors())
    finally:
        for _ in incoming:  # keep the group in step: the sender broadcasts to the end
            drained += 1
    if drained:
        raise WeightSyncError(f"load_weights() of {type(worker).__name__} stopped after {stats['buckets']} of "
                              f"{stats['buckets'] + drained} buckets")
    return stats


# ------------------------------------------------------------- controller side
def _both(sending: Any, receiving: Any, deadline: float, poll_s: float = 0.005) -> tuple[Any, Any]:
    """Results of the two ends of a sync: the first to fail raises at once (the other side
    may be blocked on it); past ``deadline`` the receivers' timeout is reported first (a
    sender blocked in a broadcast waits on them)."""
    pending = [sending, receiving]
    while pending and time.monotonic() < deadline:
        for f in [f for f in pending if f.done()]:
            f.result(timeout=0)
            pending.remove(f)
        if pending:
            time.sleep(poll_s)
    received = receiving.result(timeout=max(0.0, deadline - time.monotonic()))
    return sending.result(timeout=max(0.0, deadline - time.monotonic())), received


class BroadcastTransport(WeightTransport):
    """Weights over a gloo group between the source's rank 0 and the destination ranks (see
    the module docstring and :mod:`rlweave.weight_sync.interface` for the contract).
    ``timeout_s``: how long the group's operations (forming it included) may wait.
    ``tamper``: for tests, see :func:`send_end`."""

    name = "broadcast"

    def __init__(self, timeout_s: float = 900.0, tamper: Callable[[BucketMeta, Any], Any] | None = None):
        super().__init__(timeout_s)
        self.tamper = tamper
        self.key: str | None = None
        self._members: list[tuple["RoleHandle", list[int]]] = []

    def setup(self, src: "RoleHandle", dst: "RoleHandle") -> None:
        """Form the group: source rank 0 and every destination rank join at once."""
        from rlweave.scheduler.errors import WorkerError, WorkerTimeout

        host, port = src.submit_ranks("address", [0], [((), {})], lambda v: v[0], on_actor=True).result(
            timeout=self.timeout_s)
        key = f"rlweave-ws-{src.name}-{dst.name}-{uuid.uuid4().hex[:8]}"
        world = 1 + dst.world_size
        args = (key, host, port)
        dst_ranks = list(range(dst.world_size))
        futs = [src.submit_ranks("join_weight_group", [0], [((*args, 0, world, self.timeout_s), {})], list,
                                 fn=join_end),
                dst.submit_ranks("join_weight_group", dst_ranks,
                                 [((*args, r + 1, world, self.timeout_s), {}) for r in dst_ranks], list, fn=join_end)]
        deadline = time.monotonic() + self.timeout_s
        try:
            for f in futs:
                f.result(timeout=max(0.0, deadline - time.monotonic()))
        except WorkerTimeout as exc:
            raise WeightSyncTimeout(f"broadcast group {src.name!r} -> {dst.name!r}: {exc.role!r} rank(s) "
                                    f"{', '.join(map(str, exc.ranks))} did not join within {self.timeout_s:g} s") from None
        except WorkerError as exc:
            raise WeightSyncError(f"broadcast group {src.name!r} -> {dst.name!r}: {exc.role!r} rank {exc.rank} could "
                                  f"not join: {exc.summary}") from exc
        self.key = key
        self._members = [(src, [0]), (dst, dst_ranks)]

    def sync(self, src: "RoleHandle", dst: "RoleHandle", bucket_bytes: int, timeout_s: float) -> dict[str, Any]:
        """See :meth:`WeightTransport.sync`; floating tensors travel in the destination's
        ``weight_dtype()`` when it names one."""
        from rlweave.scheduler.errors import WorkerError, WorkerTimeout

        if self.key is None:
            raise WeightSyncError("broadcast transport: setup() was not called (or the transport is closed)")
        start = time.monotonic()
        deadline = start + timeout_s
        dtype = destination_dtype(dst, timeout_s)
        try:
            src_ranks, dst_ranks = list(range(src.world_size)), list(range(dst.world_size))
            sending = src.submit_ranks("send_weights", src_ranks,
                                       [((self.key, bucket_bytes, dtype, self.tamper), {})] * len(src_ranks),
                                       lambda v: v[0], fn=send_end)
            receiving = dst.submit_ranks("receive_weights", dst_ranks, [((self.key,), {})] * len(dst_ranks), list,
                                         fn=receive_end)
            sent, received = _both(sending, receiving, deadline)
        except WorkerTimeout as exc:
            side = "from" if exc.role == src.name else "into"
            raise WeightSyncTimeout(
                f"weight sync {side} {exc.role!r} (broadcast): rank(s) {', '.join(map(str, exc.ranks))} did not "
                f"finish within {timeout_s:g} s; the receiving worker may be stuck in load_weights()") from None
        except WorkerError as exc:
            side = "from" if exc.role == src.name else "into"
            raise from_worker_error(exc, f"weight sync {side} {exc.role!r}", " (broadcast)") from exc
        if any(r != sent for r in received):
            raise WeightSyncError(f"weight sync into {dst.name!r} (broadcast): ranks received {received}, "
                                  f"source sent {sent}")
        seconds = time.monotonic() - start
        return {**sent, "seconds": seconds, "bytes_per_s": sent["bytes"] / seconds if seconds > 0 else float("inf"),
                "dtype": dtype}

    def close(self) -> None:
        """Leave the group on every member (idempotent; members that are gone are skipped)."""
        key, members = self.key, self._members
        self.key, self._members = None, []
        for handle, ranks in members:
            try:
                handle.submit_ranks("leave_weight_group", ranks, [((key,), {})] * len(ranks), list,
                                    fn=leave_end).result(timeout=30)
            except Exception:  # noqa: BLE001 - a role already shut down has nothing to leave
                pass
