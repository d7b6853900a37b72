"""Drive ``rlweave`` in a subprocess and check what it leaves behind (end-to-end tests).

* :func:`run_cli` runs ``python -m rlweave.cli ARGS`` and records every process it starts;
  ``kill_when()`` lets a test send a signal mid-run.
* :func:`alive` / :func:`kill` find and end what outlived it (a test asserts nothing did).
* :func:`metrics_rows` reads a run's ``metrics.jsonl``; :func:`workers` its ``workers.json``.
* :func:`cli_env` is the environment such a run needs (Ray token auth off, extra ``PYTHONPATH``
  entries for user reward modules written by the test); :func:`length_reward` writes one.

Stdlib and psutil only; nothing here imports torch or Ray.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

RLWEAVE = [sys.executable, "-m", "rlweave.cli"]


def length_reward(folder: str | os.PathLike[str]) -> str:
    """Write ``folder/length_reward.py``, a reward of 0.1 x the response's length in characters
    (it differs inside every group, so every GRPO step moves the weights); returns its
    ``rewards[].name``."""
    path = Path(folder) / "length_reward.py"
    path.write_text("def length(prompt, response, **fields):\n    return 0.1 * len(response)\n")
    return f"{path}:length"


def cli_env(*paths: str | os.PathLike[str], **extra: str) -> dict[str, str]:
    """This process's environment with ``RAY_AUTH_MODE=disabled``, ``paths`` put first on
    ``PYTHONPATH`` and ``extra`` variables set."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def descendants(pid: int) -> set[int]:
    import psutil

    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def alive(pids: set[int]) -> set[int]:
    """The processes of ``pids`` that still run (zombies do not count)."""
    import psutil

    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.Error:
            pass
    return out


def kill(pids: set[int]) -> None:
    """SIGKILL whatever of ``pids`` still runs."""
    for pid in alive(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def run_cli(args: list[str], env: dict[str, str], cwd: str | os.PathLike[str] | None = None, timeout: float = 400,
            kill_when: Callable[[], bool] | None = None, sig: int = signal.SIGKILL,
            on_poll: Callable[[], None] | None = None) -> tuple[int, str, set[int]]:
    """Run ``rlweave ARGS`` and track every process it starts.

    ``kill_when()`` returning True sends ``sig`` to the main process; ``on_poll()`` runs at
    every poll (20 per second) for a test that acts on the run itself (e.g. kills a worker).
    Returns ``(returncode, stdout+stderr, pids of every descendant seen)``. A run past
    ``timeout`` is killed with everything it started, and ``AssertionError`` raised.
    """
    proc = subprocess.Popen(RLWEAVE + list(args), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=cwd)
    seen: set[int] = set()
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    deadline = time.time() + timeout
    try:
        while proc.poll() is None:
            seen |= descendants(proc.pid)
            if on_poll is not None:
                on_poll()
            if kill_when is not None and kill_when():
                proc.send_signal(sig)
                kill_when = None
            if time.time() > deadline:
                proc.kill()
                raise AssertionError(f"rlweave {' '.join(map(str, args))} did not finish within {timeout}s")
            time.sleep(0.05)
        proc.wait(timeout=60)
        reader.join(timeout=30)
    except BaseException:
        kill(seen | {proc.pid})
        raise
    return proc.returncode, "".join(chunks), seen


def metrics_rows(run_dir: str | os.PathLike[str]) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def workers(run_dir: str | os.PathLike[str]) -> dict[str, list[dict]]:
    """``workers.json`` of a run (role -> ranks with pid), or {} before the roles are built."""
    path = Path(run_dir) / "workers.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def leftovers(pids: set[int], grace_s: float = 1.0) -> set[int]:
    """The processes of ``pids`` still running ``grace_s`` after the call (it returns as soon
    as none runs): killed, and returned so a test can assert there were none
    (``assert not leftovers(pids)``)."""
    end = time.monotonic() + grace_s
    left = alive(pids)
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = alive(left)
    kill(left)
    return left


#: what only a rank's or an engine's own output contains (never rlweave's console)
FOREIGN_LINES = ("Traceback (most recent call last)", "(WorkerActor pid=", "(raylet)", " INFO ", " WARNING ",
                 "RotaryEmbedding", "Loading weights", "it/s]")


def console_problems(out: str, max_lines: int = 80) -> list[str]:
    """What is wrong with a successful run's console output ``out``: more than ``max_lines``
    lines, or a line of :data:`FOREIGN_LINES` (a traceback, a rank's or an engine's output, a
    progress bar of another library); empty when it is clean."""
    lines = out.splitlines()
    problems = [f"{len(lines)} lines (at most {max_lines})"] if len(lines) > max_lines else []
    problems += [f"foreign line: {line[:160]}" for line in lines if any(m in line for m in FOREIGN_LINES)]
    return problems
