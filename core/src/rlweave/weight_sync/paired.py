"""Controller side shared by transports whose two ends run at the same time over a channel of
their own (:mod:`~rlweave.weight_sync.broadcast`, :mod:`~rlweave.weight_sync.cuda_ipc`).

:func:`start_both_ends` starts the sending end on every source rank and the receiving end on
every destination rank (on its control channel) and returns the function that waits for both
within the sync's deadline, maps timeouts and worker errors to the weight-sync errors of
:mod:`rlweave.weight_sync.interface`, checks that every destination received what the source
sent, and returns the sync's stats.
:func:`join_channel` opens such a channel on source rank 0 and every destination rank (inside
:func:`channel_errors`, which maps the ranks' failures while a channel is set up), and
:func:`leave_channel` closes it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

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


def start_both_ends(transport: str, src: "RoleHandle", dst: "RoleHandle", send_fn: Callable[..., Any],
                    send_args: tuple, receive_fn: Callable[..., Any], receive_args: tuple, start: float,
                    timeout_s: float, dtype: str | None) -> Callable[[], dict[str, Any]]:
    """Start one sync: ``send_fn(worker, rank, *send_args)`` on every source rank (rank 0's
    stats count) and ``receive_fn(worker, rank, *receive_args)`` on every destination rank
    (on its control channel); returns the function that waits for both, all within
    ``timeout_s`` from ``start`` (a ``time.monotonic()`` reading), and returns rank 0's
    stats plus ``seconds``, ``bytes_per_s`` and ``dtype``. ``transport`` names the
    transport in errors."""
    from rlweave.worker_errors import WorkerError, WorkerTimeout

    deadline = start + timeout_s
    src_ranks, dst_ranks = list(range(src.world_size)), list(range(dst.world_size))
    sending = src.submit_ranks("send_weights", src_ranks, [(send_args, {})] * len(src_ranks), lambda v: v[0],
                               fn=send_fn)
    receiving = dst.submit_ranks("receive_weights", dst_ranks, [(receive_args, {})] * len(dst_ranks), list,
                                 fn=receive_fn, control=True)

    def finish() -> dict[str, Any]:
        try:
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

    return finish


@contextmanager
def channel_errors(where: str, timeout_s: float) -> Iterator[None]:
    """Turn a rank's timeout into :class:`WeightSyncTimeout` and its error into
    :class:`WeightSyncError`, both prefixed with ``where`` (the channel being set up)."""
    from rlweave.worker_errors import WorkerError, WorkerTimeout

    try:
        yield
    except WorkerTimeout as exc:
        raise WeightSyncTimeout(f"{where}: {exc.role!r} rank(s) {', '.join(map(str, exc.ranks))} did not answer "
                                f"within {timeout_s:g} s") from None
    except WorkerError as exc:
        raise WeightSyncError(f"{where}: {exc.role!r} rank {exc.rank} could not join: {exc.summary}") from exc


def join_channel(where: str, key: str, src: "RoleHandle", dst: "RoleHandle", join_fn: Callable[..., Any],
                 timeout_s: float, extra: tuple = ()) -> None:
    """Open channel ``key`` on source rank 0 (member 0, which hosts it at its node's address and
    a free port) and every destination rank ``r`` (member ``r + 1``), all at once:
    ``join_fn(worker, rank, key, host, port, member, 1 + dst.world_size, timeout_s, *extra)``
    (``join_weight_group``), within ``timeout_s``; failures as in :func:`channel_errors`."""
    dst_ranks = list(range(dst.world_size))
    world = 1 + dst.world_size
    with channel_errors(where, timeout_s):
        host, port = src.submit_ranks("address", [0], [((), {})], lambda v: v[0], on_actor=True).result(
            timeout=timeout_s)
        args = (key, host, port)
        futs = [src.submit_ranks("join_weight_group", [0], [((*args, 0, world, timeout_s, *extra), {})], list,
                                 fn=join_fn),
                dst.submit_ranks("join_weight_group", dst_ranks,
                                 [((*args, r + 1, world, timeout_s, *extra), {}) for r in dst_ranks], list,
                                 fn=join_fn)]
        deadline = time.monotonic() + timeout_s
        for f in futs:
            f.result(timeout=max(0.0, deadline - time.monotonic()))


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
