"""Controller side shared by transports whose two ends run at the same time over a channel of
their own (:mod:`~rlweave.weight_sync.broadcast`, :mod:`~rlweave.weight_sync.cuda_ipc`).

:func:`run_both_ends` starts the sending end on every source rank and the receiving end on
every destination rank, waits for both within the sync's deadline, maps timeouts and worker
errors to the weight-sync errors of :mod:`rlweave.weight_sync.interface`, checks that every
destination received what the source sent, and returns the sync's stats.
:func:`leave_channel` closes such a channel on its members.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from rlweave.weight_sync.interface import WeightSyncError, WeightSyncTimeout, from_worker_error

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.scheduler.handle import RoleHandle


def both(sending: Any, receiving: Any, deadline: float, poll_s: float = 0.005) -> tuple[Any, Any]:
    """Results of the two ends of a sync: the first to fail raises at once (the other side
    may be blocked on it); past ``deadline`` the receivers' timeout is reported first (a
    sender blocked on them waits for them)."""
    pending = [sending, receiving]
    while pending and time.monotonic() < deadline:
        for f in [f for f in pending if f.done()]:
            f.result(timeout=0)
            pending.remove(f)
        if pending:
            time.sleep(poll_s)
    received = receiving.result(timeout=max(0.0, deadline - time.monotonic()))
    return sending.result(timeout=max(0.0, deadline - time.monotonic())), received


def run_both_ends(transport: str, src: "RoleHandle", dst: "RoleHandle", send_fn: Callable[..., Any],
                  send_args: tuple, receive_fn: Callable[..., Any], receive_args: tuple, start: float,
                  timeout_s: float, dtype: str | None) -> dict[str, Any]:
    """One sync: ``send_fn(worker, rank, *send_args)`` on every source rank (rank 0's stats
    count) and ``receive_fn(worker, rank, *receive_args)`` on every destination rank, all
    within ``timeout_s`` from ``start`` (a ``time.monotonic()`` reading). ``transport`` names
    the transport in errors. Returns rank 0's stats plus ``seconds``, ``bytes_per_s`` and
    ``dtype``."""
    from rlweave.scheduler.errors import WorkerError, WorkerTimeout

    deadline = start + timeout_s
    src_ranks, dst_ranks = list(range(src.world_size)), list(range(dst.world_size))
    try:
        sending = src.submit_ranks("send_weights", src_ranks, [(send_args, {})] * len(src_ranks), lambda v: v[0],
                                   fn=send_fn)
        receiving = dst.submit_ranks("receive_weights", dst_ranks, [(receive_args, {})] * len(dst_ranks), list,
                                     fn=receive_fn)
        sent, received = both(sending, receiving, deadline)
    except WorkerTimeout as exc:
        side = "from" if exc.role == src.name else "into"
        raise WeightSyncTimeout(
            f"weight sync {side} {exc.role!r} ({transport}): rank(s) {', '.join(map(str, exc.ranks))} did not "
            f"finish within {timeout_s:g} s; the receiving worker may be stuck in load_weights()") from None
    except WorkerError as exc:
        side = "from" if exc.role == src.name else "into"
        raise from_worker_error(exc, f"weight sync {side} {exc.role!r}", f" ({transport})") from exc
    if any(r != sent for r in received):
        raise WeightSyncError(f"weight sync into {dst.name!r} ({transport}): ranks received {received}, "
                              f"source sent {sent}")
    seconds = time.monotonic() - start
    return {**sent, "seconds": seconds, "bytes_per_s": sent["bytes"] / seconds if seconds > 0 else float("inf"),
            "dtype": dtype}


def leave_channel(members: list[tuple["RoleHandle", list[int]]], key: str | None,
                  leave_fn: Callable[..., Any]) -> None:
    """``leave_fn(worker, rank, key)`` on every member rank (``leave_weight_group``); members
    that are gone are skipped. Nothing to do without a ``key``."""
    if key is None:
        return
    for handle, ranks in members:
        try:
            handle.submit_ranks("leave_weight_group", ranks, [((key,), {})] * len(ranks), list,
                                fn=leave_fn).result(timeout=30)
        except Exception:  # noqa: BLE001 - a role already shut down has nothing to leave
            pass
