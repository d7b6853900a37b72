"""Find and kill the processes a reward worker started (stdlib only; Linux ``/proc``).

A reward worker leads its own session and process group (it calls ``os.setsid()`` first),
and on Linux it is a child subreaper, so processes its rewards start stay findable: by
process group, by session, or as its descendants. :func:`kill_tree` stops all of them with
``SIGSTOP`` (a stopped process cannot fork), looks again until nothing new turns up, then
sends ``SIGKILL`` and waits until they have exited. Where ``/proc`` is missing only the
process group is killed.
"""

from __future__ import annotations

import os
import signal
import time


def _table() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, process group, session) of every process this one can see."""
    out: dict[int, tuple[int, int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = data[data.rfind(b")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session
        if len(fields) >= 4:
            out[int(name)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return out


def members(root: int) -> set[int]:
    """Processes in ``root``'s process group or session, and every descendant of ``root`` or
    of those; ``root`` itself excluded."""
    table = _table()
    found = {pid for pid, (_, pgid, sid) in table.items() if root in (pgid, sid)}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    stack = [root, *found]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    found.discard(root)
    return found


def _signal(pid: int, sig: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tree(root: int, include_root: bool = True, wait_s: float = 2.0) -> set[int]:
    """Kill every process of :func:`members` (and ``root`` when ``include_root``); returns
    the pids that were signalled besides ``root``, once they have exited (or after
    ``wait_s``). Never signals the calling process.

    With ``include_root`` the caller must not have reaped ``root`` yet (a zombie is fine), so
    its pid and group id cannot belong to an unrelated process."""
    me = os.getpid()
    stopped: set[int] = set()
    if include_root and root != me:
        _signal(root, signal.SIGSTOP, group=True)
    try:
        for _ in range(100):
            new = members(root) - stopped - {me}
            if not new:
                break
            for pid in new:
                _signal(pid, signal.SIGSTOP)
            stopped |= new
    finally:
        for pid in stopped:
            _signal(pid, signal.SIGKILL)
        if include_root and root != me:
            _signal(root, signal.SIGKILL, group=True)
            _signal(root, signal.SIGKILL)
        _wait_dead(stopped, wait_s)
    return stopped


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def _wait_dead(pids: set[int], wait_s: float) -> None:
    """Wait (at most ``wait_s``) until each signalled process has exited: ``SIGKILL`` is
    delivered when the process next runs, which on a busy machine is not at once."""
    end = time.monotonic() + wait_s
    left = set(pids)
    while left and time.monotonic() < end:
        left = {pid for pid in left if _running(pid)}
        if left:
            time.sleep(0.002)


def has_live_children() -> bool:
    """Reap this process's exited children; True when some child is still running."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def kill_children(scan: bool = False, timeout_s: float = 2.0) -> int:
    """Kill and reap everything this process started (its group, session and descendants);
    returns how many processes were killed. Without ``scan`` it costs one ``waitpid`` when
    no child runs; a process that is not a child subreaper passes ``scan=True`` to also
    look through ``/proc`` for orphaned grandchildren."""
    if not has_live_children() and not (scan and members(os.getpid())):
        return 0
    killed = kill_tree(os.getpid(), include_root=False)
    end = time.monotonic() + timeout_s
    while has_live_children() and time.monotonic() < end:
        time.sleep(0.002)
    return len(killed)
