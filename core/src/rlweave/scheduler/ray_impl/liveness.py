"""Which of the run's rank actors Ray reports dead, whatever the controller is waiting on.

A call on a rank whose process dies fails at once (Ray fails its pending result). A rank that
dies between calls, while the controller waits on another role, would only be noticed at
its next call, possibly much later. :data:`LIVENESS` closes that gap: every
:class:`~rlweave.scheduler.ray_impl.group.RayWorkerGroup` registers its actors, and every
wait asks :meth:`Liveness.dead` (a GCS actor-table query, at most once per ``interval_s``),
so a dead rank of any role is reported within a few seconds of its death.

Actors a group kills on purpose are unregistered first, so they are never reported.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DeadRank:
    """A registered rank whose actor Ray reports dead; ``reason`` is Ray's death cause."""

    role: str
    rank: int
    reason: str


def _reason(info: dict[str, Any]) -> str:
    cause = str(info.get("DeathCause") or "")
    for line in cause.splitlines():
        line = line.strip()
        if line.startswith("error_message:"):
            text = line.split(":", 1)[1].strip().strip('"')
            return text.split(". Some common causes")[0]
    pid = info.get("Pid")
    return f"the actor process{f' (pid {pid})' if pid else ''} is dead"


class Liveness:
    """Registry of live rank actors and a rate-limited check of their state."""

    def __init__(self, interval_s: float = 2.0) -> None:
        self.interval_s = interval_s
        self._actors: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()
        self._last = 0.0
        self._dead: dict[str, DeadRank] = {}  # actor id -> what was found

    def register(self, role: str, rank: int, actor: Any) -> None:
        with self._lock:
            self._actors[actor._actor_id.hex()] = (role, rank)

    def unregister(self, actor: Any) -> None:
        with self._lock:
            self._actors.pop(actor._actor_id.hex(), None)
            self._dead.pop(actor._actor_id.hex(), None)

    def dead(self, force: bool = False) -> list[DeadRank]:
        """Registered ranks that Ray reports dead (cached for ``interval_s`` unless ``force``)."""
        now = time.monotonic()
        with self._lock:
            if not self._actors or (not force and now - self._last < self.interval_s):
                return list(self._dead.values())
            self._last = now
            watched = dict(self._actors)
        try:
            from ray._private import state

            table = state.actors(actor_state_name="DEAD") or {}
        except Exception:  # noqa: BLE001 - no cluster state to ask: report nothing new
            return list(self._dead.values())
        with self._lock:
            for aid, info in table.items():
                if aid in watched and aid in self._actors:
                    self._dead[aid] = DeadRank(*watched[aid], _reason(info))
            return list(self._dead.values())


#: the process-wide registry the Ray worker groups use
LIVENESS = Liveness()
