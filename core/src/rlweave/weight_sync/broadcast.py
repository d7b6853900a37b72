"""Broadcast transport: buckets go from the source's rank 0 to every destination rank over a
torch.distributed group of their own (NCCL when every member is a CUDA rank, else gloo).

:meth:`BroadcastTransport.setup` forms the group once per (source, destination) pair: source
rank 0 (group rank 0, which also hosts the group's ``TCPStore``) and destination ranks
``0..m-1`` (group ranks ``1..m``). The group is separate from each role's own process group
and lives in the rank processes until :meth:`~BroadcastTransport.close`.

A sync runs both ends at once. Every source rank iterates ``named_weights()`` (it may run
collectives; only rank 0 yields tensors). Source rank 0 packs checksummed buckets (with gloo
the object store's, :mod:`rlweave.weight_sync.buckets`) and broadcasts each as three messages:
the lengths ``[header bytes, payload bytes]``, the JSON header (names, shapes, dtypes, offsets,
checksum), the payload; ``[-1, -1]`` ends the sync. Destination ranks verify each bucket and
stream its tensors into ``load_weights``. Nothing goes through the controller or Ray's object
store, and the source holds one bucket at a time. A destination that finds a corrupt bucket
keeps receiving to the end marker (so the group stays in step) and then fails naming the
bucket. The group's operations time out after the sync timeout given at ``setup``.

Backend (chosen in ``setup`` from the members' ``ctx.device``, asked by
:func:`~rlweave.weight_sync.auto.locate_end`): with gloo the buckets are packed on the host
(:func:`~rlweave.weight_sync.buckets.iter_buckets`); with NCCL each bucket is packed on the source's GPU
(:mod:`rlweave.weight_sync.device_buckets`, device checksum) and stays on the devices: the
lengths and header travel as small device tensors, the receivers verify on their GPU.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterator

from rlweave.weight_sync.buckets import BucketMeta, cast_floating, iter_buckets, unpack_bucket
from rlweave.weight_sync.dtype import dtype_for
from rlweave.weight_sync.interface import WeightSyncError, WeightTransport
from rlweave.weight_sync.paired import channel_errors, join_channel, leave_channel, start_both_ends

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from rlweave.scheduler.handle import RoleHandle

#: rank-process registry: group key -> (store, process group, device its tensors live on)
_GROUPS: dict[str, tuple[Any, Any, Any]] = {}
_END = (-1, -1)


# ----------------------------------------------------------------- rank side
def join_end(worker: Any, rank: int, key: str, host: str, port: int, group_rank: int, world: int,  # noqa: ARG001
             timeout_s: float, backend: str = "gloo") -> int:
    """Join group ``key`` as ``group_rank`` of ``world`` (group rank 0 hosts the store) over
    ``backend`` (``nccl``: on this process's current CUDA device)."""
    import torch
    import torch.distributed as dist

    from rlweave.rendezvous import tcp_store

    timeout = timedelta(seconds=timeout_s)
    store = tcp_store(host, port, world, group_rank == 0, timeout)
    prefixed = dist.PrefixStore(key, store)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        device = torch.device("cuda", torch.cuda.current_device())
        _GROUPS[key] = (store, dist.ProcessGroupNCCL(prefixed, group_rank, world, opts), device)
    else:
        _GROUPS[key] = (store, dist.ProcessGroupGloo(prefixed, group_rank, world, timeout), torch.device("cpu"))
    return group_rank


def leave_end(worker: Any, rank: int, key: str) -> bool:  # noqa: ARG001
    """Drop group ``key`` in this process (idempotent)."""
    return _GROUPS.pop(key, None) is not None


def _group(key: str) -> Any:
    if key not in _GROUPS:
        raise WeightSyncError(f"broadcast group {key} is not set up in this process (setup() not called, or closed)")
    return _GROUPS[key][1]


def _group_device(key: str) -> Any:
    return _GROUPS[key][2] if key in _GROUPS else None


def _host_buckets(named: Any, bucket_bytes: int, device: Any) -> Iterator[tuple[BucketMeta, Any]]:  # noqa: ARG001
    for meta, payload in iter_buckets(named, bucket_bytes):
        yield meta, payload


def _device_buckets(named: Any, bucket_bytes: int, device: Any) -> Iterator[tuple[BucketMeta, Any]]:
    """Buckets packed on ``device`` (NCCL groups), a fresh payload tensor each."""
    import torch

    from rlweave.weight_sync import device_buckets as db

    for i, items in enumerate(db.group(named, bucket_bytes)):
        items = [(n, t.to(device)) for n, t in items]
        yield db.pack(i, items, lambda n: torch.empty(n, dtype=torch.uint8, device=device))


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
    pg, device = _group(key), _group_device(key)
    on_device = device.type == "cuda"
    stats = {"buckets": 0, "bytes": 0, "tensors": 0}
    for meta, payload in (_device_buckets if on_device else _host_buckets)(named, bucket_bytes, device):
        header = json.dumps({"index": meta.index, "names": meta.names, "shapes": meta.shapes,
                             "dtypes": meta.dtypes, "offsets": meta.offsets, "nbytes": meta.nbytes,
                             "checksum": meta.checksum}).encode()
        if tamper is not None:
            payload = tamper(meta, payload)
        _bcast(pg, torch.tensor([len(header), meta.nbytes], dtype=torch.int64, device=device))
        _bcast(pg, torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device))
        _bcast(pg, payload if on_device else torch.from_numpy(payload))
        stats["buckets"] += 1
        stats["bytes"] += meta.nbytes
        stats["tensors"] += len(meta.names)
    _bcast(pg, torch.tensor(_END, dtype=torch.int64, device=device))
    return stats


def _meta(header: bytes) -> BucketMeta:
    d = json.loads(header)
    return BucketMeta(int(d["index"]), tuple(d["names"]), tuple(tuple(s) for s in d["shapes"]), tuple(d["dtypes"]),
                      tuple(d["offsets"]), int(d["nbytes"]), str(d["checksum"]))


def _buckets(pg: Any, device: Any) -> Iterator[tuple[BucketMeta, Any]]:
    """Received buckets: payload a numpy array (gloo) or a device tensor (NCCL)."""
    import torch

    while True:
        lengths = _bcast(pg, torch.empty(2, dtype=torch.int64, device=device)).tolist()
        if tuple(lengths) == _END:
            return
        header = _bcast(pg, torch.empty(lengths[0], dtype=torch.uint8, device=device))
        payload = _bcast(pg, torch.empty(lengths[1], dtype=torch.uint8, device=device))
        yield _meta(header.cpu().numpy().tobytes()), payload if device.type == "cuda" else payload.numpy()


def receive_end(worker: Any, rank: int, key: str, version: int | None = None) -> dict[str, int]:  # noqa: ARG001
    """Receiving end, on every destination rank: verify each bucket and stream it into
    ``worker.load_weights`` (landing as :mod:`rlweave.weight_sync.landing` says, the worker
    taking ``version``); drain to the end marker before raising on a bad bucket."""
    from rlweave.weight_sync.landing import landing

    load = getattr(worker, "load_weights", None)
    if load is None:
        raise WeightSyncError(f"{type(worker).__name__} has no load_weights(); it cannot receive weights")
    import torch

    from rlweave.weight_sync import device_buckets as db

    incoming = _buckets(_group(key), _group_device(key))
    stats = {"buckets": 0, "bytes": 0, "tensors": 0}
    drained = 0

    def tensors() -> Iterator[tuple[str, Any]]:
        for meta, payload in incoming:
            if isinstance(payload, torch.Tensor):
                db.verify(meta, payload, "receiver")
                items = db.views(meta, payload)  # a fresh device tensor per bucket: the receiver's own
            else:
                items = unpack_bucket(meta, payload, "receiver")
            stats["buckets"] += 1
            stats["bytes"] += meta.nbytes
            stats["tensors"] += len(items)
            yield from items

    try:
        with landing(worker, version):
            load(tensors())
    finally:
        for _ in incoming:  # keep the group in step: the sender broadcasts to the end
            drained += 1
    if drained:
        raise WeightSyncError(f"load_weights() of {type(worker).__name__} stopped after {stats['buckets']} of "
                              f"{stats['buckets'] + drained} buckets")
    return stats


# ------------------------------------------------------------- controller side
def backend_for(members: list[dict[str, Any]]) -> str:
    """``nccl`` when every member (a :func:`~rlweave.weight_sync.auto.locate_end` record) is a
    CUDA rank, else ``gloo``."""
    return "nccl" if members and all(m["device"] == "cuda" for m in members) else "gloo"


class BroadcastTransport(WeightTransport):
    """Weights over a gloo or NCCL group between the source's rank 0 and the destination ranks (see
    the module docstring and :mod:`rlweave.weight_sync.interface` for the contract).
    ``timeout_s``: how long the group's operations (forming it included) may wait.
    ``tamper``: for tests, see :func:`send_end`."""

    name = "broadcast"
    stamps_version = True

    def __init__(self, timeout_s: float = 900.0, tamper: Callable[[BucketMeta, Any], Any] | None = None):
        super().__init__(timeout_s)
        self.tamper = tamper
        self.backend: str | None = None  # set by setup()
        self.key: str | None = None
        self._members: list[tuple["RoleHandle", list[int]]] = []

    def setup(self, src: "RoleHandle", dst: "RoleHandle") -> None:
        """Form the group: source rank 0 and every destination rank join at once, over NCCL
        when all of them are CUDA ranks (:func:`backend_for`), else gloo."""
        from rlweave.weight_sync.auto import locate

        dst_ranks = list(range(dst.world_size))
        where = f"broadcast group {src.name!r} -> {dst.name!r}"
        key = f"rlweave-ws-{src.name}-{dst.name}-{uuid.uuid4().hex[:8]}"
        with channel_errors(where, self.timeout_s):
            self.backend = backend_for([*locate(src, [0], self.timeout_s), *locate(dst, dst_ranks, self.timeout_s)])
        join_channel(where, key, src, dst, join_end, self.timeout_s, (self.backend,))
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
        if self.key is None:
            raise WeightSyncError("broadcast transport: setup() was not called (or the transport is closed)")
        start = time.monotonic()
        dtype = dtype_for(self, dst, timeout_s)
        return start_both_ends("broadcast", src, dst, send_end, (self.key, bucket_bytes, dtype, self.tamper),
                               receive_end, (self.key, version), start, timeout_s + queued_s, dtype)

    def close(self) -> None:
        """Leave the group on every member (idempotent; members that are gone are skipped)."""
        key, members = self.key, self._members
        self.key, self._members = None, []
        leave_channel(members, key, leave_end)
