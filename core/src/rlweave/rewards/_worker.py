"""Entry point of a reward worker process (kept stdlib-only so workers start fast).

Protocol on one duplex pipe, parent -> worker: ``(call_id, fn_index, kwargs)`` or ``None``
(stop); worker -> parent: ``("ready", pid)`` once, or ``("load_error", traceback)``, then
``(call_id, "ok", float)`` / ``(call_id, "error", message)`` per call.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import signal
import sys
import traceback
from typing import Any


def import_reward_target(target: str) -> Any:
    """``package.module:function`` or ``/path/to/file.py:function`` -> the object."""
    module_name, _, attr = target.partition(":")
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        name = "rlweave_user_reward_" + "".join(c if c.isalnum() else "_" for c in path)
        obj = sys.modules.get(name)
        if obj is None:
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None or not os.path.isfile(path):
                raise ImportError(f"reward file not found: {path}")
            obj = importlib.util.module_from_spec(spec)
            sys.modules[name] = obj
            try:
                spec.loader.exec_module(obj)
            except BaseException:
                sys.modules.pop(name, None)
                raise
    else:
        obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def worker_main(conn: Any, targets: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        fns = [import_reward_target(t) for t in targets]
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("load_error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # parent went away
        if msg is None:
            return
        call_id, index, kwargs = msg
        try:
            value = float(fns[index](**kwargs))
            if not math.isfinite(value):
                raise ValueError(f"reward returned a non-finite value {value}")
            reply = (call_id, "ok", value)
        except BaseException as exc:  # noqa: BLE001 - SystemExit from user code is a failure too
            tb = traceback.format_exc(limit=-3)
            reply = (call_id, "error", f"{type(exc).__name__}: {exc}\n{tb}")
        conn.send(reply)
