"""Where a rank is stuck: its Python stacks, taken from outside the process.

A rank's call may hang in Python or in native code (a collective, an engine) that never
returns to the interpreter. Each worker process therefore arms :mod:`faulthandler` for
:data:`SIGNAL` (:func:`install`): on that signal the interpreter writes every thread's stack
at the C level, whatever the process is doing, into a file that has no name (an unlinked
temporary file, gone with the process: nothing is left behind). The process says where that
file is (:class:`StackSource`: pid, the file's descriptor, node address); another process on
the same machine signals it and reads what was written through ``/proc/<pid>/fd/<fd>``
(:func:`dump`; Linux). A rank on another machine is read by running ``rlweave stacks`` there.

Contract: :func:`dump` never raises; it returns the stacks, or a sentence saying why they
cannot be read (another node, the process is gone, a platform without ``/proc``). The
scheduler puts the stuck ranks' stacks into :class:`~rlweave.worker_errors.WorkerTimeout`;
``rlweave stacks RUN_DIR`` dumps every live rank of a run. Standard library only.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

#: the signal a worker's stacks are dumped on (Python's default for it would end the process)
SIGNAL = signal.SIGUSR1
#: innermost frames of a thread kept by :func:`calls_in`
FRAMES = 12

_FILE: Any = None
_PREFIX = "rlweave-stacks-"


@dataclass(frozen=True)
class StackSource:
    """Where one process writes its stacks: ``pid``, ``fd`` (its descriptor of the unnamed
    file) and ``node_ip`` (the address of its machine, as the scheduler knows it)."""

    pid: int
    fd: int
    node_ip: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: Any) -> StackSource | None:
        """The source in ``row`` (a :meth:`to_dict` or a ``workers.json`` row with ``pid``
        and ``stack_fd``), or None when it holds none."""
        if not isinstance(row, dict):
            return None
        fd = row.get("fd", row.get("stack_fd"))
        if row.get("pid") is None or fd is None:
            return None
        return cls(int(row["pid"]), int(fd), row.get("node_ip"))


def install(node_ip: str | None = None) -> StackSource:
    """Arm this process: :data:`SIGNAL` writes every thread's stack to an unnamed file
    (idempotent). Returns where the stacks go."""
    global _FILE
    if _FILE is None:
        fd, name = tempfile.mkstemp(prefix=_PREFIX)  # named, so /proc shows whose it is...
        os.unlink(name)  # ...and gone from the disk at once: the process holds the only reference
        _FILE = os.fdopen(fd, "w+b")
        faulthandler.register(SIGNAL, file=_FILE, all_threads=True, chain=False)
    return StackSource(os.getpid(), _FILE.fileno(), node_ip)


def dump(source: StackSource | None, wait_s: float = 3.0) -> str:
    """Signal ``source``'s process and return the stacks it wrote (``Thread 0x...`` blocks,
    most recent call first), or a sentence saying why there are none. Only a process of this
    machine whose descriptor ``fd`` is an armed stacks file is signalled (never another
    process that happens to have the pid). Waits at most ``wait_s`` seconds for the dump."""
    if source is None:
        return "(no stack: the rank did not say where it writes them)"
    path = f"/proc/{source.pid}/fd/{source.fd}"
    try:
        armed = _PREFIX in os.readlink(path)
    except OSError:
        armed = False
    if not armed:
        node = f" (it runs on {source.node_ip}: run `rlweave stacks RUN_DIR` there)" if source.node_ip else ""
        return f"(no stack: process {source.pid} is not running on this machine{node})"
    try:
        start = os.stat(path).st_size
        os.kill(source.pid, SIGNAL)
    except OSError as exc:
        return f"(no stack: process {source.pid} cannot be signalled: {exc.strerror})"
    deadline, size, steady = time.monotonic() + wait_s, start, 0
    while time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            now = os.stat(path).st_size
        except OSError:
            return f"(no stack: pid {source.pid} ended)"
        steady = steady + 1 if now == size and now > start else 0
        size = now
        if steady >= 3:  # written, and nothing more for 0.15 s
            break
    if size <= start:
        return f"(no stack: pid {source.pid} wrote none within {wait_s:g} s)"
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(size - start).decode("utf-8", "replace").rstrip()
    except OSError as exc:
        return f"(no stack: pid {source.pid} cannot be read: {exc.strerror})"


def calls_in(stacks: str, marker: str, frames: int = FRAMES) -> str:
    """The blocks of ``stacks`` (a :func:`dump`) of the threads whose stack holds ``marker``
    (a file path fragment: the frame that runs a worker's calls), else of the thread the
    signal interrupted, each cut to its ``frames`` innermost frames; the whole text when
    there is no such block (a sentence from :func:`dump`)."""
    blocks = [b.strip() for b in stacks.split("\n\n") if b.strip()]
    chosen = [b for b in blocks if marker in b] or [b for b in blocks if b.startswith("Current thread")]
    if not chosen:
        return stacks
    out = []
    for block in chosen:
        lines = block.splitlines()
        head, body = lines[0], lines[1:]
        more = len(body) - frames
        out.append("\n".join([head] + body[:frames] + ([f"  ... {more} outer frame(s)"] if more > 0 else [])))
    return "\n\n".join(out)
