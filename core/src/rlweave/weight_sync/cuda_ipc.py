"""CUDA IPC transport: colocated roles pass memory handles of buckets, not their bytes.

For roles on one node (on GPU: every destination rank sees the GPU of the source's rank 0,
as when the roles share devices). On CPU the same protocol runs over shared-memory tensors
(:mod:`rlweave.weight_sync.handles`), which is how it is tested without a GPU.

:meth:`CudaIpcTransport.setup` checks the roles are colocated (:func:`~rlweave.weight_sync.auto.locate_end`
on their ranks; otherwise it refuses, naming the rank and its node or GPU) and opens a
channel: a ``TCPStore`` hosted by source rank 0, which every destination rank joins. Only
small messages go through it; the destination ranks sit in one ``load_weights`` call for the
whole sync, so buckets cannot come to them as calls.

A sync (the ``n``-th over the channel), both ends at once:

* every source rank iterates ``named_weights()`` (it may run collectives); rank 0 packs
  bucket ``i`` (:mod:`rlweave.weight_sync.device_buckets`, on its device) into buffer slot
  ``i % 2``, first waiting until every destination rank acknowledged bucket ``i - 2``, the
  slot's previous bucket; it publishes ``(meta, handle)`` under ``n/m/i`` and, after the
  last bucket, an end marker; it returns once every bucket is acknowledged, then frees the
  buffers (nothing stays allocated between syncs);
* every destination rank opens bucket ``i`` from its handle, copies the payload into memory
  of its own (one device copy), verifies the checksum, acknowledges (``n/a/i/<rank>``) and
  streams the tensors into ``load_weights`` (which may keep them). A rank that finds a
  corrupt bucket, or whose ``load_weights`` fails, keeps acknowledging to the end marker (so
  the source never waits on it) and then fails naming the bucket.

Timeouts: the controller ends a sync after ``timeout_s`` with :class:`WeightSyncTimeout`;
inside the ranks every wait on the channel ends after the ``timeout_s`` given at
construction, so a source whose receiver is stuck frees itself.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterator

from rlweave.weight_sync.dtype import dtype_for
from rlweave.weight_sync.interface import WeightSyncError, WeightSyncTimeout, WeightTransport

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from rlweave.scheduler.handle import RoleHandle
    from rlweave.weight_sync.buckets import BucketMeta

#: rank-process registry: channel key -> (store, timeout_s)
_CHANNELS: dict[str, tuple[Any, float]] = {}
_END = b"end"
SLOTS = 2  # buffers on the source: one being loaded while the next is packed


# ----------------------------------------------------------------- rank side
def open_channel(key: str, host: str, port: int, is_source: bool, world: int, timeout_s: float) -> Any:
    """Join (``is_source``: host) channel ``key`` in this process; returns its store."""
    import torch.distributed as dist

    from rlweave.rendezvous import tcp_store

    store = tcp_store(host, port, world, is_source, timedelta(seconds=timeout_s))
    _CHANNELS[key] = (dist.PrefixStore(key, store), timeout_s)
    return _CHANNELS[key][0]


def join_end(worker: Any, rank: int, key: str, host: str, port: int, member: int, world: int,  # noqa: ARG001
             timeout_s: float) -> bool:
    """Open channel ``key`` as ``member`` of ``world`` (member 0, the source, hosts it)."""
    open_channel(key, host, port, member == 0, world, timeout_s)
    return True


def leave_end(worker: Any, rank: int, key: str) -> bool:  # noqa: ARG001
    """Drop channel ``key`` in this process (idempotent)."""
    return _CHANNELS.pop(key, None) is not None


def _channel(key: str) -> tuple[Any, float]:
    if key not in _CHANNELS:
        raise WeightSyncError(f"cuda_ipc channel {key} is not set up in this process (setup() not called, or closed)")
    return _CHANNELS[key]


def _device(worker: Any) -> "torch.device":
    import torch

    if getattr(getattr(worker, "ctx", None), "device", "cpu") == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def encode_message(meta: "BucketMeta", handle: tuple) -> bytes:
    """A bucket's message on the channel: JSON of its meta and memory handle (never a pickle)."""
    from dataclasses import asdict

    from rlweave.weight_sync.handles import handle_to_json

    return json.dumps({"meta": asdict(meta), "handle": handle_to_json(handle)}).encode()


def decode_message(msg: bytes) -> tuple["BucketMeta", tuple]:
    """``(meta, handle)`` of an :func:`encode_message` message; ``WeightSyncError`` when it is not one."""
    from rlweave.weight_sync.buckets import BucketMeta
    from rlweave.weight_sync.handles import handle_from_json

    try:
        data = json.loads(msg)
        m = data["meta"]
        meta = BucketMeta(int(m["index"]), tuple(m["names"]), tuple(tuple(x) for x in m["shapes"]),
                          tuple(m["dtypes"]), tuple(m["offsets"]), int(m["nbytes"]), str(m["checksum"]))
        return meta, handle_from_json(data["handle"])
    except WeightSyncError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything malformed is one error
        raise WeightSyncError(f"malformed cuda_ipc message on the channel ({type(exc).__name__}: {exc})") from None


def wait_acks(store: Any, n: int, index: int, receivers: int, timeout_s: float) -> None:
    """Block until every destination rank acknowledged bucket ``index`` of sync ``n``."""
    keys = [f"{n}/a/{index}/{r}" for r in range(receivers)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except Exception as exc:  # noqa: BLE001 - torch raises DistStoreError / RuntimeError on timeout
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        raise WeightSyncTimeout(f"destination rank(s) {', '.join(map(str, missing))} did not acknowledge bucket "
                                f"{index} within {timeout_s:g} s ({type(exc).__name__})") from None


def send_buckets(store: Any, n: int, receivers: int, named: Any, bucket_bytes: int, device: Any,
                 timeout_s: float, tamper: Callable[["BucketMeta", Any], Any] | None = None) -> dict[str, int]:
    """Source rank 0's side of sync ``n`` (see the module docstring); ``tamper(meta,
    payload)`` changes a shared payload in place after its checksum was taken (tests)."""
    from rlweave.weight_sync import device_buckets as db
    from rlweave.weight_sync.handles import new_buffer, share

    slots: list[Any] = [None] * SLOTS
    stats = {"buckets": 0, "bytes": 0, "tensors": 0}
    for i, items in enumerate(db.group(named, bucket_bytes)):
        s = i % SLOTS
        if i >= SLOTS:
            wait_acks(store, n, i - SLOTS, receivers, timeout_s)  # the slot's previous bucket is done with
        nbytes = db.packed_size(items)
        if slots[s] is None or slots[s][0].numel() < nbytes:
            slots[s] = None  # free the smaller buffer first
            buf = new_buffer(nbytes, device)
            slots[s] = (buf, share(buf))
        buf, handle = slots[s]
        meta, flat = db.pack(i, items, lambda _n, b=buf: b)
        del items
        if tamper is not None:
            tamper(meta, flat)
        if flat.device.type == "cuda":  # receivers read it from other processes: the copies must be done
            import torch

            torch.cuda.current_stream(flat.device).synchronize()
        store.set(f"{n}/m/{i}", encode_message(meta, handle))
        stats["buckets"] += 1
        stats["bytes"] += meta.nbytes
        stats["tensors"] += len(meta.names)
    store.set(f"{n}/m/{stats['buckets']}", _END)
    for i in range(max(0, stats["buckets"] - SLOTS), stats["buckets"]):
        wait_acks(store, n, i, receivers, timeout_s)
    slots.clear()  # every receiver is done: the buffers go
    return stats


def receive_buckets(store: Any, n: int, rank: int, load: Callable[[Iterator], Any], device: Any) -> dict[str, int]:
    """A destination rank's side of sync ``n``: stream verified, owned tensors into ``load``;
    acknowledge every bucket (to the end marker, also after a failure)."""
    from rlweave.weight_sync import device_buckets as db
    from rlweave.weight_sync.handles import open_handle

    stats = {"buckets": 0, "bytes": 0, "tensors": 0}
    state = {"next": 0}

    def next_message() -> Any:
        i = state["next"]
        msg = store.get(f"{n}/m/{i}")
        if msg == _END:
            return None
        state["next"] = i + 1
        return decode_message(msg)

    def tensors() -> Iterator[tuple[str, Any]]:
        while (msg := next_message()) is not None:
            meta, handle = msg
            try:
                shared = open_handle(handle)[:meta.nbytes]
                own = shared.to(device, copy=True)  # what is verified is what gets loaded
                del shared
                db.verify(meta, own, "receiver")
            finally:
                store.set(f"{n}/a/{meta.index}/{rank}", b"1")
            items = db.views(meta, own)
            stats["buckets"] += 1
            stats["bytes"] += meta.nbytes
            stats["tensors"] += len(items)
            yield from items

    drained = 0
    try:
        load(tensors())
    finally:
        while (msg := next_message()) is not None:  # acknowledge the rest: the source never waits on us
            store.set(f"{n}/a/{msg[0].index}/{rank}", b"1")
            drained += 1
    if drained:
        raise WeightSyncError(f"load_weights() stopped after {stats['buckets']} of {stats['buckets'] + drained} "
                              "buckets")
    return stats


def send_end(worker: Any, rank: int, key: str, n: int, receivers: int, bucket_bytes: int, dtype: str | None,
             tamper: Callable[["BucketMeta", Any], Any] | None = None) -> dict[str, int]:
    """Sending end, on every source rank (only rank 0 sends)."""
    from rlweave.weight_sync.buckets import cast_floating

    named = cast_floating(worker.named_weights(), dtype)
    if rank != 0:
        for _ in named:
            pass
        return {}
    store, timeout_s = _channel(key)
    return send_buckets(store, n, receivers, named, bucket_bytes, _device(worker), timeout_s, tamper)


def receive_end(worker: Any, rank: int, key: str, n: int, version: int | None = None) -> dict[str, int]:
    """Receiving end, on every destination rank (landing as :mod:`rlweave.weight_sync.landing`
    says, the worker taking ``version``)."""
    from rlweave.weight_sync.landing import landing

    load = getattr(worker, "load_weights", None)
    if load is None:
        raise WeightSyncError(f"{type(worker).__name__} has no load_weights(); it cannot receive weights")
    store, _ = _channel(key)
    with landing(worker, version):
        return receive_buckets(store, n, rank, load, _device(worker))


# ------------------------------------------------------------- controller side
class CudaIpcTransport(WeightTransport):
    """Weights by memory handle between colocated roles (see the module docstring and
    :mod:`rlweave.weight_sync.interface` for the contract). ``timeout_s``: how long the
    channel's waits (forming it included) may last. ``tamper``: for tests, see
    :func:`send_buckets`."""

    name = "cuda_ipc"
    stamps_version = True

    def __init__(self, timeout_s: float = 900.0, tamper: Callable[["BucketMeta", Any], Any] | None = None):
        super().__init__(timeout_s)
        self.tamper = tamper
        self.key: str | None = None
        self.syncs = 0
        self._members: list[tuple["RoleHandle", list[int]]] = []

    def setup(self, src: "RoleHandle", dst: "RoleHandle") -> None:
        """Check the roles are colocated (else raise :class:`WeightSyncError` saying why) and
        open the channel."""
        from rlweave.weight_sync.auto import colocation_problem, locate
        from rlweave.weight_sync.paired import channel_errors, join_channel

        dst_ranks = list(range(dst.world_size))
        where = f"cuda_ipc {src.name!r} -> {dst.name!r}"
        with channel_errors(where, self.timeout_s):
            problem = colocation_problem(locate(src, [0], self.timeout_s)[0], locate(dst, dst_ranks, self.timeout_s),
                                         src.name, dst.name)
        if problem:
            raise WeightSyncError(f"{where}: {problem}; use weight_sync.transport broadcast or object_store")
        key = f"rlweave-ipc-{src.name}-{dst.name}-{uuid.uuid4().hex[:8]}/"
        join_channel(where, key, src, dst, join_end, self.timeout_s)
        self.key = key
        self._members = [(src, [0]), (dst, dst_ranks)]

    def sync(self, src: "RoleHandle", dst: "RoleHandle", bucket_bytes: int, timeout_s: float,
             version: int | None = None) -> dict[str, Any]:
        """See :meth:`WeightTransport.sync`; floating tensors travel in the destination's
        ``weight_dtype()`` when it names one."""
        return self.begin(src, dst, bucket_bytes, timeout_s, version=version)()

    def begin(self, src: "RoleHandle", dst: "RoleHandle", bucket_bytes: int, timeout_s: float,
              queued_s: float = 0.0, version: int | None = None) -> Callable[[], dict[str, Any]]:
        """See :meth:`WeightTransport.begin`: both ends are started (the receiving end on the
        destination's control channel) and the returned function waits for them."""
        from rlweave.weight_sync.paired import start_both_ends

        if self.key is None:
            raise WeightSyncError("cuda_ipc transport: setup() was not called (or the transport is closed)")
        start = time.monotonic()
        dtype = dtype_for(self, dst, timeout_s)
        self.syncs += 1
        return start_both_ends("cuda_ipc", src, dst, send_end,
                               (self.key, self.syncs, dst.world_size, bucket_bytes, dtype, self.tamper),
                               receive_end, (self.key, self.syncs, version), start, timeout_s + queued_s, dtype)

    def close(self) -> None:
        """Leave the channel on every member (idempotent; members that are gone are skipped)."""
        from rlweave.weight_sync.paired import leave_channel

        key, members = self.key, self._members
        self.key, self._members = None, []
        leave_channel(members, key, leave_end)
