"""The sandbox of one reward worker process (stdlib only: it runs before the rewards load).

:func:`enter` is the worker's first act, before any reward is imported:

* its own session and process group (``os.setsid``), and on Linux a child subreaper, so
  the pool can kill the worker with everything it started, and the worker can find
  what a call left running (:mod:`rlweave.sandbox.proctree`);
* ``memory_mb``: an address-space limit (``RLIMIT_AS``), so an allocation beyond it raises
  ``MemoryError`` in the reward instead of taking the machine's memory. Address space, not
  resident memory, is what the kernel can limit per process, so the worker also keeps the
  per-thread reservations small: BLAS/OpenMP pools default to one thread
  (``OMP_NUM_THREADS`` etc., unless set) and glibc keeps at most two malloc arenas;
* ``private_dir``: its own directory as cwd and ``TMPDIR`` (made and removed by the pool);
* ``processes`` / ``network``: refused through an audit hook (:mod:`rlweave.sandbox.guard`).

:class:`CpuLimit` gives each call ``cpu_s`` CPU seconds (``RLIMIT_CPU``, whole seconds past
what the worker used so far); the kernel's ``SIGXCPU`` becomes :class:`CpuTimeExceeded` in
the reward, an error outcome, and the worker stays. The limits guard against accidents and
runaway code, not against deliberately malicious native code.
"""

from __future__ import annotations

import math
import os
import resource
import signal
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from rlweave.sandbox.guard import install as install_guard

#: config path of these options, named in error messages
PREFIX = "reward_runtime.sandbox"
#: thread-pool variables a memory-limited worker sets to 1 unless they are set
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
_PR_SET_CHILD_SUBREAPER = 36
_M_ARENA_MAX = -8


@dataclass(frozen=True)
class SandboxLimits:
    """What a reward worker may do (the defaults match :class:`~rlweave.rewards.sections.RewardSandbox`).

    ``memory_mb``: address space in MiB, ``None`` = unlimited. ``cpu_s``: CPU seconds per
    call, ``None`` = unlimited (the pool fills in its ``timeout_s``). ``private_dir``: own
    cwd and ``TMPDIR``. ``network``, ``processes``: allowed or refused."""

    memory_mb: int | None = 4096
    cpu_s: float | None = None
    private_dir: bool = True
    network: bool = True
    processes: bool = False


class CpuTimeExceeded(BaseException):
    """A reward call used up its CPU time (``SIGXCPU``). A ``BaseException``, so that a
    reward's ``except Exception`` does not swallow it."""


def enter(limits: SandboxLimits, workdir: str | None) -> bool:
    """Apply ``limits`` to this process (see the module docstring); ``workdir`` is its
    private directory or ``None``. Returns whether this process is a child subreaper."""
    try:
        os.setsid()
    except OSError:  # already a session leader
        pass
    subreaper = _become_subreaper()
    if workdir is not None:
        sys.path[:] = [os.path.abspath(p) if isinstance(p, str) else p for p in sys.path]
        os.chdir(workdir)
        os.environ["TMPDIR"] = workdir
        tempfile.tempdir = None  # re-read on next use
    if limits.memory_mb is not None:
        for var in THREAD_VARS:
            os.environ.setdefault(var, "1")
        _mallopt(_M_ARENA_MAX, 2)
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = limits.memory_mb << 20
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        except (ValueError, OSError):
            if sys.platform.startswith("linux"):
                raise
            # macOS refuses RLIMIT_AS: no memory limit there
    signal.signal(signal.SIGXCPU, CpuLimit.on_sigxcpu)
    install_guard(processes=limits.processes, network=limits.network, prefix=PREFIX)
    return subreaper


def _become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _mallopt(param: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(param, value)
    except (OSError, AttributeError):  # not glibc
        pass


class CpuLimit:
    """Per-call CPU budget: ``with CpuLimit(cpu_s):`` around one call (``None``: no limit)."""

    armed = False
    seconds: float | None = None

    def __init__(self, cpu_s: float | None) -> None:
        self.cpu_s = cpu_s
        self.saved: tuple[int, int] | None = None

    def __enter__(self) -> CpuLimit:
        if self.cpu_s is None:
            return self
        self.saved = resource.getrlimit(resource.RLIMIT_CPU)
        hard = self.saved[1]
        usage = resource.getrusage(resource.RUSAGE_SELF)
        limit = math.ceil(usage.ru_utime + usage.ru_stime + self.cpu_s)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        CpuLimit.seconds, CpuLimit.armed = self.cpu_s, True
        resource.setrlimit(resource.RLIMIT_CPU, (limit, hard))
        return self

    def __exit__(self, *exc: object) -> None:
        CpuLimit.armed = False
        if self.saved is not None:
            resource.setrlimit(resource.RLIMIT_CPU, self.saved)

    @staticmethod
    def on_sigxcpu(signum: int, frame: Any) -> None:
        if CpuLimit.armed:  # the kernel repeats SIGXCPU every CPU second until the call ends
            raise CpuTimeExceeded(
                f"the reward call used more than {CpuLimit.seconds:g} s of CPU time ({PREFIX}.cpu_s)"
            )


#: messages of failures that an address-space limit causes besides MemoryError
_OUT_OF_MEMORY = ("out of memory", "cannot allocate memory", "can't start new thread", "std::bad_alloc")


def explain(exc: BaseException, limits: SandboxLimits) -> str:
    """A hint to append to the message of ``exc`` when a sandbox limit likely caused it."""
    if limits.memory_mb is None:
        return ""
    if isinstance(exc, MemoryError) or any(m in str(exc).lower() for m in _OUT_OF_MEMORY):
        return (f" (reward workers may map at most {limits.memory_mb} MiB of address space, "
                f"this one maps {_vm_size_mb()} MiB now: {PREFIX}.memory_mb)")
    return ""


def _vm_size_mb() -> str:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return str(int(line.split()[1]) // 1024)
    except (OSError, ValueError, IndexError):
        pass
    return "?"
