"""Entry point of a reward worker process (kept stdlib-only so workers start fast).

Protocol on one duplex pipe, parent -> worker: ``(call_id, fn_index, kwargs)`` or ``None``
(stop); worker -> parent: ``("ready", pid)`` once, or ``("load_error", traceback)``, then
``(call_id, "ok", float)`` / ``(call_id, "error", message)`` per call.

Before importing the rewards the worker enters its sandbox (:mod:`rlweave.sandbox.limits`:
own session, memory limit, private directory, process/network refusal). Each call runs
under its CPU budget; when it returns, whatever processes it left running are killed
before the reply is sent, so nothing a call started outlives it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import traceback
from typing import Any

from rlweave.sandbox.limits import CpuLimit, CpuTimeExceeded, SandboxLimits, enter, explain
from rlweave.sandbox.proctree import kill_children
from rlweave.targets import ReferenceKind, import_reference

#: a reward's or tool's function, as the worker imports it (files by their absolute path)
_USER_FUNCTION = ReferenceKind("function", module_prefix="rlweave_user_reward_")


def import_reward_target(target: str) -> Any:
    """``package.module:function`` or ``path/to/file.py:function`` (from the current directory)
    -> the object, through the references every kind shares (:func:`rlweave.targets.import_reference`);
    raises :class:`rlweave.targets.TargetError` saying what is wrong."""
    return import_reference(target, _USER_FUNCTION)[0]


def worker_main(conn: Any, targets: list[str], limits: SandboxLimits | None = None,
                workdir: str | None = None, numeric: bool = True) -> None:
    """Serve calls on ``conn`` until ``None`` or the parent goes away (see the module docstring).
    ``limits``: the sandbox (``None``: :class:`SandboxLimits` defaults); ``workdir``: the
    private directory the pool made for this worker, or ``None``; ``numeric``: results must be
    finite numbers (rewards), else any value, sent back as text (tools: a string as it is,
    anything else as JSON)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    limits = limits if limits is not None else SandboxLimits()
    try:
        _run(conn, targets, limits, workdir, numeric)
    except OSError:  # BrokenPipeError and the like: the parent went away
        pass
    finally:  # the pool removes it too; this covers a parent that died
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(conn: Any, targets: list[str], limits: SandboxLimits, workdir: str | None, numeric: bool) -> None:
    me = os.getpid()
    try:
        subreaper = enter(limits, workdir)
        fns = [import_reward_target(t) for t in targets]
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        cause = getattr(exc, "cause", None)  # what the module raised (a TargetError says which reference)
        conn.send(("load_error", traceback.format_exc() + explain(cause if cause is not None else exc, limits)))
        return
    kill_children(scan=not subreaper)  # processes a reward module started at import
    conn.send(("ready", None))
    _serve(conn, fns, limits, me, subreaper, numeric)


def _serve(conn: Any, fns: list[Any], limits: SandboxLimits, me: int, subreaper: bool, numeric: bool) -> None:
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # parent went away
        if msg is None:
            return
        call_id, index, kwargs = msg
        try:
            reply = _call(call_id, fns[index], kwargs, limits, numeric)
        except CpuTimeExceeded as exc:  # arrived while the reply was being made
            reply = (call_id, "error", f"{type(exc).__name__}: {exc}")
        if os.getpid() != me:  # a child the reward forked returned here: it must not answer
            os._exit(0)
        kill_children(scan=not subreaper)
        conn.send(reply)


def _call(call_id: int, fn: Any, kwargs: dict[str, Any], limits: SandboxLimits,
          numeric: bool = True) -> tuple[int, str, Any]:
    with CpuLimit(limits.cpu_s):
        try:
            if not numeric:
                out = fn(**kwargs)
                return (call_id, "ok", out if isinstance(out, str) else json.dumps(out, default=str))
            value = float(fn(**kwargs))
            if not math.isfinite(value):
                raise ValueError(f"reward returned a non-finite value {value}")
            return (call_id, "ok", value)
        except BaseException as exc:  # noqa: BLE001 - SystemExit from user code is a failure too
            tb = traceback.format_exc(limit=-3)
            return (call_id, "error", f"{type(exc).__name__}: {exc}{explain(exc, limits)}\n{tb}")
