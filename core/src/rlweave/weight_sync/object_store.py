"""Object-store transport: buckets travel through Ray's shared-memory object store.

Controller side (:class:`ObjectStoreTransport`): every source rank runs :func:`send_end`;
rank 0 returns ``[(BucketMeta, ObjectRef), ...]``; every destination rank runs
:func:`receive_end` on that list; all within one deadline.

Rank side (:func:`send_end`, :func:`receive_end`): run inside the rank processes through the
role handle's generic call (``submit_ranks(..., fn=...)``), named ``send_weights`` and
``receive_weights`` in errors, timeouts and faults.

Memory: rank 0 holds one bucket at a time, but the object store keeps every bucket of a
sync until the sync returns (the whole model once, in shared memory); receivers copy one
bucket at a time out of it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from rlweave.weight_sync.buckets import BucketMeta, iter_buckets, unpack_bucket
from rlweave.weight_sync.dtype import dtype_for
from rlweave.weight_sync.interface import WeightSyncError, WeightSyncTimeout, WeightTransport, from_worker_error

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from rlweave.scheduler.handle import RoleHandle


# ----------------------------------------------------------------- worker side
def put_buckets(named: Iterable[tuple[str, "torch.Tensor"]], bucket_bytes: int, keep: bool) -> list:
    """Consume ``named`` to the end; with ``keep`` put each bucket into the object store
    and return ``[(meta, ref), ...]``, else return ``[]`` (non-zero source ranks)."""
    import ray

    if not keep:
        for _ in named:
            pass
        return []
    return [(meta, ray.put(payload)) for meta, payload in iter_buckets(named, bucket_bytes)]


def load_buckets(worker: Any, bucket_refs: list, timeout_s: float) -> dict[str, Any]:
    """Fetch, verify and stream every bucket into ``worker.load_weights`` within ``timeout_s``."""
    import ray
    from ray.exceptions import GetTimeoutError

    load = getattr(worker, "load_weights", None)
    if load is None:
        raise WeightSyncError(f"{type(worker).__name__} has no load_weights(); it cannot receive weights")
    deadline = time.monotonic() + timeout_s
    stats = {"buckets": 0, "bytes": 0, "tensors": 0}

    def tensors() -> Iterator[tuple[str, "torch.Tensor"]]:
        for meta, ref in bucket_refs:
            try:
                payload = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except GetTimeoutError:
                raise WeightSyncTimeout(f"{meta.describe()} not fetched within {timeout_s:g} s") from None
            items = unpack_bucket(meta, payload, "receiver")
            del payload
            stats["buckets"] += 1
            stats["bytes"] += meta.nbytes
            stats["tensors"] += len(items)
            yield from items

    load(tensors())
    if stats["buckets"] != len(bucket_refs):
        raise WeightSyncError(
            f"load_weights() of {type(worker).__name__} stopped after {stats['buckets']} of {len(bucket_refs)} buckets"
        )
    return stats


def send_end(worker: Any, rank: int, bucket_bytes: int, dtype: str | None = None) -> list:
    """Sending end, on every source rank: iterate ``named_weights()`` (all ranks, as it may
    run collectives), floating tensors cast to ``dtype`` if given; rank 0 puts checksummed
    buckets into the object store and returns ``[(BucketMeta, ObjectRef), ...]``, other
    ranks ``[]``."""
    from rlweave.weight_sync.buckets import cast_floating

    return put_buckets(cast_floating(worker.named_weights(), dtype), bucket_bytes, keep=rank == 0)


def receive_end(worker: Any, rank: int, bucket_refs: list, timeout_s: float,  # noqa: ARG001
                version: int | None = None) -> dict[str, Any]:
    """Receiving end, on every destination rank: :func:`load_buckets`, landing as
    :func:`rlweave.weight_sync.landing.landing` says (the worker takes ``version``)."""
    from rlweave.weight_sync.landing import landing

    with landing(worker, version):
        return load_buckets(worker, bucket_refs, timeout_s)


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


class ObjectStoreTransport(WeightTransport):
    """Weights through Ray's object store (see the module docstring and
    :mod:`rlweave.weight_sync.interface` for the contract). Works wherever Ray runs."""

    name = "object_store"
    stamps_version = True

    def send(self, src: "RoleHandle", bucket_bytes: int, timeout_s: float,
             dtype: str | None = None) -> list[tuple[BucketMeta, Any]]:
        """Phase 1: buckets of the source's weights in the object store (rank 0's list),
        floating tensors cast to ``dtype`` when given."""
        from rlweave.worker_errors import WorkerError, WorkerTimeout

        ranks = list(range(src.world_size))
        rank_args = [((bucket_bytes, dtype), {})] * len(ranks)
        fut = src.submit_ranks("send_weights", ranks, rank_args, lambda v: v[0], fn=send_end)
        try:
            return fut.result(timeout=timeout_s)
        except WorkerTimeout as exc:
            raise WeightSyncTimeout(
                f"weight sync from {src.name!r}: rank(s) {', '.join(map(str, exc.ranks))} did not finish "
                f"named_weights() within {timeout_s:g} s"
            ) from None
        except WorkerError as exc:
            raise WeightSyncError(f"weight sync from {src.name!r} rank {exc.rank}: sending failed: {exc.summary}") from exc

    def receive(
        self, dst: "RoleHandle", sent: list[tuple[BucketMeta, Any]], timeout_s: float, wait_s: float | None = None,
        version: int | None = None,
    ) -> list[dict[str, Any]]:
        """Phase 2: every destination rank fetches, verifies and loads ``sent`` (and takes
        ``version``), within ``wait_s`` (default ``timeout_s``, the sync's whole budget named
        in errors)."""
        wait_s = timeout_s if wait_s is None else wait_s
        return self._wait_receive(dst, sent, self._submit_receive(dst, sent, wait_s, version), timeout_s, wait_s)

    def _submit_receive(self, dst: "RoleHandle", sent: list[tuple[BucketMeta, Any]], wait_s: float,
                        version: int | None) -> Any:
        ranks = list(range(dst.world_size))
        return dst.submit_ranks("receive_weights", ranks, [((sent, wait_s, version), {})] * len(ranks), list,
                                fn=receive_end, control=True)

    def _wait_receive(self, dst: "RoleHandle", sent: list[tuple[BucketMeta, Any]], fut: Any, timeout_s: float,
                      wait_s: float) -> list[dict[str, Any]]:
        from rlweave.worker_errors import WorkerError, WorkerTimeout

        total = sum(m.nbytes for m, _ in sent)
        try:
            return fut.result(timeout=wait_s)
        except WorkerTimeout as exc:
            raise WeightSyncTimeout(
                f"weight sync into {dst.name!r}: rank(s) {', '.join(map(str, exc.ranks))} did not answer within "
                f"{timeout_s:g} s ({len(sent)} bucket(s), {total / 2**20:.1f} MiB sent); the receiving worker may be "
                "stuck in load_weights()"
            ) from None
        except WorkerError as exc:
            raise from_worker_error(exc, f"weight sync into {dst.name!r}") from exc

    def begin(self, src: "RoleHandle", dst: "RoleHandle", bucket_bytes: int, timeout_s: float,
              queued_s: float = 0.0, version: int | None = None) -> Callable[[], dict[str, Any]]:
        """A sync that does not wait for the destination: the source's buckets are in the
        object store when this returns (the source is free to train again) and the
        destination's receiving end is started on its control channel (on an engine with a
        control plane the load lands between two decoding steps of a running call; without
        one it waits behind the calls queued before it, up to ``queued_s`` on top of
        ``timeout_s``); the returned function waits for it and returns :meth:`sync`'s stats."""
        start = time.monotonic()
        dtype = dtype_for(self, dst, timeout_s)
        sent = self.send(src, bucket_bytes, timeout_s, dtype)
        wait_s = timeout_s + queued_s
        fut = self._submit_receive(dst, sent, wait_s, version)

        def finish() -> dict[str, Any]:
            self._wait_receive(dst, sent, fut, timeout_s, max(0.0, start + wait_s - time.monotonic()))
            return self._stats(sent, time.monotonic() - start, dtype)

        return finish

    def sync(self, src: "RoleHandle", dst: "RoleHandle", bucket_bytes: int, timeout_s: float,
             version: int | None = None) -> dict[str, Any]:
        """See :meth:`WeightTransport.sync`; floating tensors travel in the destination's
        ``weight_dtype()`` when it names one."""
        start = time.monotonic()
        deadline = start + timeout_s
        dtype = dtype_for(self, dst, timeout_s)
        sent = self.send(src, bucket_bytes, _remaining(deadline), dtype)
        self.receive(dst, sent, timeout_s, wait_s=_remaining(deadline), version=version)
        return self._stats(sent, time.monotonic() - start, dtype)

    @staticmethod
    def _stats(sent: list[tuple[BucketMeta, Any]], seconds: float, dtype: str | None) -> dict[str, Any]:
        nbytes = sum(m.nbytes for m, _ in sent)
        return {
            "bytes": nbytes,
            "tensors": sum(len(m.names) for m, _ in sent),
            "buckets": len(sent),
            "seconds": seconds,
            "bytes_per_s": nbytes / seconds if seconds > 0 else float("inf"),
            "dtype": dtype,
        }
