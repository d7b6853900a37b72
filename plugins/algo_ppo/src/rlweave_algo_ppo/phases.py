"""Which roles are resident in which phase of a PPO step, and the calls that get them there.

A PPO step has four phases: ``generate`` (rollout engine), ``experience`` (forward passes of
policy, reference, critic and reward models), ``train`` (policy and critic updates) and
``sync`` (policy -> rollout weights). When roles share devices (``resources.colocate``),
the ones idle in a phase are put away: training/scoring roles ``offload()`` their
parameters and optimizer state to CPU memory, the rollout engine ``sleep()``s (its KV cache,
and weights where supported), and they are brought back (``onload()``/``wake_up()``) before
the phase that needs them. On separate pools nothing moves and calls simply overlap.
Between steps (and after evaluation) the algorithm returns to ``rest``: the trained roles
resident, so the runner can checkpoint them.

``mode``: ``never`` (nothing moves), ``always`` (every idle role moves), ``auto`` (only
roles that share devices with another needed role move).
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

#: roles resident in each phase (reward-model roles are matched by the ``reward`` prefix)
PHASE_ROLES: dict[str, tuple[str, ...]] = {
    "generate": ("rollout",),
    "experience": ("policy", "reference", "critic", "reward*"),
    "train": ("policy", "critic"),
    "sync": ("policy", "rollout"),
    "eval": ("rollout",),
    # between steps: the runner may checkpoint the trained roles (a backend may refuse to
    # save while offloaded), and the next step starts by generating
    "rest": ("policy", "critic", "rollout"),
}


def colocated_roles(colocate: Iterable[Iterable[str]], needed: Iterable[str]) -> set[str]:
    """Needed roles that share devices with at least one other needed role."""
    need = set(needed)
    out: set[str] = set()
    for group in colocate:
        members = [r for r in group if r in need]
        if len(members) > 1:
            out.update(members)
    return out


def _wanted(phase: str, role: str) -> bool:
    for r in PHASE_ROLES[phase]:
        if r == role or (r.endswith("*") and role.startswith(r[:-1])):
            return True
    return False


class PhaseManager:
    """Tracks residency and moves roles between phases; ``enter(phase)`` returns seconds spent."""

    def __init__(self, roles: Mapping[str, Any], colocate: Iterable[Iterable[str]], mode: str = "auto"):
        if mode not in ("auto", "always", "never"):
            raise ValueError(f"offload mode {mode!r}: choose auto, always or never")
        self.roles = dict(roles)
        if mode == "never":
            self.movable: set[str] = set()
        elif mode == "always":
            self.movable = set(self.roles)
        else:
            self.movable = colocated_roles(colocate, self.roles)
        self.resident = {r: True for r in self.roles}
        self.moves: list[tuple[str, str, str]] = []  # (phase, role, "out"|"in"), for tests and logs

    def _call(self, role: str, out: bool) -> Any:
        h = self.roles[role]
        if role == "rollout":
            return h.sleep() if out else h.wake_up()
        return h.offload() if out else h.onload()

    def enter(self, phase: str) -> float:
        """Put away the movable roles not needed in ``phase`` first (freeing memory), then
        bring back the needed ones; waits for all of it."""
        t0 = time.perf_counter()
        outs = [r for r in self.movable if self.resident[r] and not _wanted(phase, r)]
        ins = [r for r in self.movable if not self.resident[r] and _wanted(phase, r)]
        for group, going_out in ((sorted(outs), True), (sorted(ins), False)):
            futs = [self._call(r, going_out) for r in group]
            for r, f in zip(group, futs):
                f.result()
                self.resident[r] = not going_out
                self.moves.append((phase, r, "out" if going_out else "in"))
        return time.perf_counter() - t0

    @property
    def sequential_train(self) -> bool:
        """Train policy and critic one after the other (each alone on the devices) when
        both move between phases; otherwise their updates overlap."""
        return "policy" in self.movable and "critic" in self.movable

    def only(self, role: str, phase: str = "train") -> float:
        """Inside ``phase``, keep only ``role`` resident among the movable roles of that
        phase (used to train policy and critic one at a time)."""
        t0 = time.perf_counter()
        others = [r for r in self.movable if r != role and self.resident[r] and _wanted(phase, r)]
        for r in sorted(others):
            self._call(r, True).result()
            self.resident[r] = False
            self.moves.append((phase, r, "out"))
        if role in self.movable and not self.resident[role]:
            self._call(role, False).result()
            self.resident[role] = True
            self.moves.append((phase, role, "in"))
        return time.perf_counter() - t0
