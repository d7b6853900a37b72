"""The destination's weight dtype, asked once per transport and destination (:func:`dtype_for`).

:func:`dtype_end` runs on the destination's rank 0 through the generic call named
``weight_dtype`` (errors, timeouts, faults), on its control channel, so the question never
waits behind queued ``generate`` calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlweave.weight_sync.interface import WeightSyncError, WeightSyncTimeout

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.scheduler.handle import RoleHandle
    from rlweave.weight_sync.interface import WeightTransport


def dtype_end(worker: Any, rank: int) -> str | None:  # noqa: ARG001
    """The worker's ``weight_dtype()`` (engines, see ``RolloutEngine``), else None."""
    fn = getattr(worker, "weight_dtype", None)
    return fn() if callable(fn) else None


# ------------------------------------------------------------- controller side
def destination_dtype(dst: "RoleHandle", timeout_s: float) -> str | None:
    """The destination's ``weight_dtype()`` (asked of its rank 0 over its control channel,
    :func:`dtype_end`), or None; every transport sends floating tensors in it (transports ask
    through :func:`dtype_for`, which remembers it)."""
    from rlweave.worker_errors import WorkerError, WorkerTimeout

    try:
        return dst.submit_ranks("weight_dtype", [0], [((), {})], lambda v: v[0], fn=dtype_end,
                                control=True).result(timeout=timeout_s)
    except WorkerTimeout:
        raise WeightSyncTimeout(f"weight sync into {dst.name!r}: rank 0 did not answer within {timeout_s:g} s") \
            from None
    except WorkerError as exc:
        raise WeightSyncError(f"weight sync into {dst.name!r} rank {exc.rank}: {exc.summary}") from exc


def dtype_for(transport: "WeightTransport", dst: "RoleHandle", timeout_s: float) -> str | None:
    """``dst``'s ``weight_dtype()`` for ``transport``: asked (:func:`destination_dtype`) the
    first time, then remembered on the transport for this handle (a rebuilt role gets a new
    transport, :meth:`rlweave.weight_sync.WeightSync.forget`)."""
    cache: dict[int, tuple[Any, str | None]] = transport.__dict__.setdefault("_dtypes", {})
    known = cache.get(id(dst))
    if known is None or known[0] is not dst:
        known = cache[id(dst)] = (dst, destination_dtype(dst, timeout_s))
    return known[1]
