"""Where ranks meet: a torch.distributed ``TCPStore`` that listens only on the address it is
reached at.

A role's process group and the weight-sync channels (:mod:`rlweave.weight_sync.broadcast`,
:mod:`rlweave.weight_sync.cuda_ipc`) rendezvous through a ``TCPStore`` hosted by one rank at
its node's Ray address (``host``) and a free port there. torch's store server listens on every
interface (``::``) whatever ``host`` it is given: a port open on networks nobody reaches it
by, and, on a cluster bound to loopback, a port on the machine's network. :func:`tcp_store`
binds the listening socket to ``host`` itself and hands it to the store, so the store is
reachable exactly where its clients are told to connect.

Importing this module imports no torch.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

BACKLOG = 256


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` only (``port`` 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def tcp_store(host: str, port: int, world_size: int, is_master: bool, timeout: timedelta) -> Any:
    """A ``torch.distributed.TCPStore`` of ``world_size`` members at ``host:port``. The master
    (``is_master``) serves it on ``host:port`` only; the others connect there. Does not wait
    for the other members."""
    import torch.distributed as dist

    if not is_master:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout, wait_for_workers=False)
    sock = listen_socket(host, port)
    try:
        store = dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False,
                              master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store's server owns the descriptor from now on
    return store
