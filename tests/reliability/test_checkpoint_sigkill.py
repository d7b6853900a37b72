"""SIGKILL at random moments while checkpoints are being saved never costs the newest complete
checkpoint: after each kill it verifies (checksums) and loads bitwise equal to a replay.

A child saves real checkpoints in a loop (FSDP ``checkpoint.save`` of a 0.6M-parameter MLP on
one gloo rank, with the run loop's ``state.json`` / ``rng.json``, through ``CheckpointManager``,
keep_last 2); it is SIGKILLed 20 times at a uniformly random moment after its first commit
(``ckpt_saver.py`` forks it from a server that imported torch once).
"""

from __future__ import annotations

import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("rlweave_backend_fsdp")

TRIALS = 20
SAVER = Path(__file__).with_name("ckpt_saver.py")


class _Server:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, str(SAVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, prefix: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"the saver did not say {prefix!r} within {timeout} s")
            if line.startswith(prefix):
                return line[len(prefix):].strip()
            if line.startswith("fail"):
                pytest.fail(f"saver: {line}")

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def _phase(root: Path) -> str:
    names = {p.name for p in root.iterdir()}
    if any(n.startswith(".tmp-") for n in names):
        return "writing"
    if any(n.startswith("step_") and not (root / n / "COMPLETE").exists() for n in names):
        return "publishing"
    return "between saves"


def test_sigkill_during_save_keeps_newest_complete_checkpoint_loadable(guarantee, tmp_path):
    rnd = random.Random(20261124)
    server = _Server()
    recovered, phases, steps = 0, {}, []
    t0 = time.monotonic()
    try:
        server.expect("ready", timeout=120)
        for trial in range(TRIALS):
            root = tmp_path / f"trial{trial}"
            server.send(f"save {root} {trial}")
            pid = int(server.expect("pid"))
            server.expect("committed 1")
            time.sleep(rnd.uniform(0.0, 1.0))
            import os

            os.kill(pid, signal.SIGKILL)
            server.send(f"reap {pid}")
            status = int(server.expect("exited"))
            if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                pytest.fail(f"trial {trial}: the saver ended with status {status}, not by SIGKILL")
            phase = _phase(root)
            phases[phase] = phases.get(phase, 0) + 1
            server.send(f"check {root} {trial}")
            steps.append(int(server.expect("ok")))
            recovered += 1
    finally:
        server.close()
    elapsed = time.monotonic() - t0
    if recovered != TRIALS:
        pytest.fail(f"{recovered} of {TRIALS} recovered")
    where = ", ".join(f"{n} {k}" for k, n in sorted(phases.items()))
    guarantee("SIGKILL during save",
              f"{recovered} of {TRIALS} SIGKILLs at random moments (killed while: {where}) left the newest complete "
              f"checkpoint verifying and loading bitwise equal to a replay (steps {min(steps)}-{max(steps)}); "
              f"{elapsed:.0f} s in all")
