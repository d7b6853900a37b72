"""On-CPU seconds per step of a run's processes, by role, over a window of its steps (light: psutil).

A run of ``rlweave train`` writes ``workers.json`` in its run directory once its roles are built
(role -> ranks, each with its ``pid``) and one line of ``metrics.jsonl`` per step.
:class:`StepWindowCPU` is polled by whoever waits for the run (a bench) and reads each role's
CPU time (user + system, of every rank of the role and the processes under it, such as an engine's
workers) when the run has logged ``first_step`` steps and again when it has logged ``last_step``;
the controller (the ``rlweave train`` process itself, without its children: Ray's daemons and the
ranks are under it) is reported as ``"controller"``. A process that holds several roles (every role
in the controller with ``run.scheduler: in_process``) is charged to none of them.

Beside a step's wall time this says where a step's time goes on the CPU: a role whose on-CPU seconds
per step come close to the step's duration is what the step waits for (on a CPU machine, one core per
role); on a GPU machine the same figure is each role's host-side work. Polling reads one small file;
a window boundary is seen up to one poll interval late.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil


def _steps_logged(metrics: Path) -> int:
    """Lines of ``metrics`` that are a step's (they carry ``time/step``); 0 before the file exists."""
    try:
        return sum(1 for line in metrics.read_text().splitlines() if '"time/step"' in line)
    except OSError:
        return 0


def _tree_times(pid: int, children: bool) -> dict[int, float]:
    """pid -> on-CPU seconds (user + system) of ``pid`` and, with ``children``, every process under
    it; processes that are gone are left out."""
    out: dict[int, float] = {}
    try:
        root = psutil.Process(pid)
        procs = [root] + (root.children(recursive=True) if children else [])
    except psutil.Error:
        return out
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[p.pid] = float(t.user + t.system)
    return out


class StepWindowCPU:
    """Each role's on-CPU seconds per step between the ``first_step``-th and the ``last_step``-th
    step line of the run in ``run_dir``, whose controller is ``controller_pid``. Call :meth:`poll`
    every fraction of a step while the run goes on, then :meth:`result`."""

    def __init__(self, run_dir: Path, controller_pid: int, first_step: int, last_step: int):
        if last_step <= first_step:
            raise ValueError(f"last_step ({last_step}) must be larger than first_step ({first_step})")
        self.run_dir, self.controller = Path(run_dir), int(controller_pid)
        self.first_step, self.last_step = int(first_step), int(last_step)
        self._start: tuple[int, dict[str, dict[int, float]]] | None = None
        self._end: tuple[int, dict[str, dict[int, float]]] | None = None

    def _pids(self) -> dict[str, list[int]]:
        try:
            ranks = json.loads((self.run_dir / "workers.json").read_text())
        except (OSError, ValueError):
            ranks = {}
        roles = {role: [int(r["pid"]) for r in entries if r.get("pid")] for role, entries in ranks.items()}
        roles["controller"] = [self.controller]
        # a process that holds several roles (run.scheduler: in_process) cannot be split between them
        seen = [pid for pids in roles.values() for pid in set(pids)]
        shared = {pid for pid in seen if seen.count(pid) > 1}
        return {role: [pid for pid in pids if pid not in shared] for role, pids in roles.items()}

    def _snapshot(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for role, pids in self._pids().items():
            times: dict[int, float] = {}
            for pid in pids:
                times.update(_tree_times(pid, children=role != "controller"))
            out[role] = times
        return out

    def poll(self) -> None:
        """Take the window's first reading once ``first_step`` steps are logged, its last once
        ``last_step`` are; nothing otherwise."""
        if self._end is not None:
            return
        steps = _steps_logged(self.run_dir / "metrics.jsonl")
        if self._start is None and steps >= self.first_step:
            self._start = (steps, self._snapshot())
        elif self._start is not None and steps >= self.last_step:
            self._end = (steps, self._snapshot())

    def result(self) -> dict[str, float | None] | None:
        """Role -> on-CPU seconds per step over the window (per role, the processes seen at both
        readings; None for a role none of whose processes was), or None when the run did not reach
        both ends of the window."""
        if self._start is None or self._end is None or self._end[0] <= self._start[0]:
            return None
        (s0, a), (s1, b) = self._start, self._end
        out: dict[str, float | None] = {}
        for role, before in a.items():
            after = b.get(role, {})
            both = [pid for pid in before if pid in after]
            out[role] = sum(after[pid] - before[pid] for pid in both) / (s1 - s0) if both else None
        return out
