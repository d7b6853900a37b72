"""Refuse process starts and network access to reward code (stdlib only).

:func:`install` adds a Python audit hook (``sys.addaudithook``) to a reward worker before its
rewards are imported. A refused operation raises :class:`PermissionError` in the reward,
whose message names the sandbox option that allows it, so the call ends as an error
outcome and the worker lives on.

* processes: ``os.fork``, ``os.forkpty``, ``os.posix_spawn``, ``os.exec*``, ``os.system``,
  ``subprocess.Popen``, and ``_posixsubprocess.fork_exec`` called directly (as
  ``multiprocessing`` starts its resource tracker and forkserver; it raises no audit event,
  so the worker's copy of that function is replaced);
* network: creating IP sockets (``AF_INET``, ``AF_INET6``, ``AF_PACKET``), connecting,
  binding or sending on them, and name lookups (``getaddrinfo``, ``gethostbyname``...).
  Unix sockets stay allowed.

This guards against accidents and runaway code (a fork bomb, a stray download), not against
deliberately malicious code: native code (C extensions, ``ctypes`` calling libc) does not
pass through audit hooks, and a hook cannot be removed but can be bypassed that way.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

PROCESS_EVENTS = frozenset(
    {"os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system", "os.startfile",
     "subprocess.Popen", "pty.spawn"}
)
LOOKUP_EVENTS = frozenset(
    {"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr",
     "socket.getnameinfo"}
)
SOCKET_EVENTS = frozenset({"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"})
IP_FAMILIES = frozenset(
    int(getattr(socket, name)) for name in ("AF_INET", "AF_INET6", "AF_PACKET") if hasattr(socket, name)
)


def refusal(what: str, event: str, option: str) -> PermissionError:
    """The error a refused operation raises: what, through which call, which option allows it."""
    return PermissionError(f"{what} is denied in reward workers ({event}); set {option}: true to allow it")


def install(processes: bool, network: bool, prefix: str = "reward_runtime.sandbox") -> None:
    """Refuse what is not allowed, for the rest of this process's life (hooks cannot be
    removed). ``prefix`` is the config path of the sandbox options named in the errors."""
    if processes and network:
        return
    watched = (PROCESS_EVENTS if not processes else frozenset()) | (
        LOOKUP_EVENTS | SOCKET_EVENTS | {"socket.__new__"} if not network else frozenset()
    )

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in watched:
            return
        if event in PROCESS_EVENTS:
            raise refusal("starting processes", event, f"{prefix}.processes")
        if event == "socket.__new__":
            if len(args) > 1 and args[1] in IP_FAMILIES:
                raise refusal("network access", f"{event} family {args[1]}", f"{prefix}.network")
            return
        if event in SOCKET_EVENTS and getattr(args[0], "family", None) not in IP_FAMILIES:
            return
        raise refusal("network access", event, f"{prefix}.network")

    sys.addaudithook(hook)
    if not processes:
        _refuse_fork_exec(f"{prefix}.processes")


def _refuse_fork_exec(option: str) -> None:
    try:
        import _posixsubprocess
    except ImportError:  # not POSIX
        return

    def fork_exec(*args: Any, **kwargs: Any) -> Any:
        raise refusal("starting processes", "_posixsubprocess.fork_exec", option)

    _posixsubprocess.fork_exec = fork_exec  # type: ignore[attr-defined]
