"""``sync_weights``: one weight sync between two role handles (algorithms go through
:class:`rlweave.weight_sync.WeightSync`, which calls it), and the timeout it defaults to."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.scheduler.handle import RoleHandle
    from rlweave.weight_sync.interface import WeightTransport


#: sync timeout when the destination handle names none
DEFAULT_TIMEOUT_S = 900.0


def sync_timeout(dst: "RoleHandle", timeout_s: float | None = None) -> float:
    """``timeout_s`` when given, else the destination's ``roles.<role>.timeouts.sync``, else
    :data:`DEFAULT_TIMEOUT_S` (a handle without timeouts)."""
    if timeout_s is not None:
        return float(timeout_s)
    limit = getattr(dst, "timeout_for", lambda _m: (None, None))("receive_weights")[0]
    return float(limit) if limit is not None else DEFAULT_TIMEOUT_S


def sync_weights(
    src: "RoleHandle",
    dst: "RoleHandle",
    bucket_bytes: int = 64 << 20,
    timeout_s: float | None = None,
    transport: "WeightTransport | None" = None,
    version: int | None = None,
) -> dict[str, Any]:
    """Copy ``src``'s current weights into every rank of ``dst`` (blocking).

    ``timeout_s`` defaults to the destination's ``roles.<role>.timeouts.sync`` (900 s when the
    handle has no timeouts).

    Uses ``transport`` (default: the object-store transport, which sends floating tensors in
    the destination engine's ``weight_dtype()``). Returns ``bytes``, ``tensors``,
    ``buckets``, ``seconds``, ``bytes_per_s`` (and the transport's extras, e.g. ``dtype``). Raises
    :class:`~rlweave.weight_sync.interface.WeightSyncTimeout` when it does not finish within
    ``timeout_s`` and :class:`~rlweave.weight_sync.interface.WeightSyncError` on a corrupt
    bucket or a worker error.
    """
    timeout_s = sync_timeout(dst, timeout_s)
    if transport is None:
        from rlweave.weight_sync.object_store import ObjectStoreTransport

        transport = ObjectStoreTransport()
    if version is None:
        return transport.sync(src, dst, bucket_bytes, timeout_s)
    if getattr(transport, "stamps_version", False):
        return transport.sync(src, dst, bucket_bytes, timeout_s, version=version)
    info = transport.sync(src, dst, bucket_bytes, timeout_s)
    dst.call("set_weight_version", int(version)).result(timeout=timeout_s)
    return info
