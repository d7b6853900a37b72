"""An episode's own time, the time ``agent.timeout_s`` limits.

The limit is on what the agent itself spends: its code, its tools, the HTTP round trips. Time
while at least one of the episode's requests is queued for the engine or being generated does
not count (the clock is paused then; requests sent at once pause it once), so an episode is not
ended because the engine is busy with other episodes (a large evaluation, a loaded machine). A
hung engine is the business of the engine call's timeout (``roles.rollout.timeouts.generate``).

:class:`AgentClock` starts when it is created; the endpoint pauses it around each engine wait
(:meth:`AgentClock.engine_wait`, from the server's event loop) and the rollout reads
:meth:`AgentClock.own_s` (from its own thread): it is thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class AgentClock:
    """Seconds since creation less the seconds during which a request was waiting for the engine.
    ``now``: the clock read (``time.monotonic``; a test may pass its own)."""

    def __init__(self, now: Callable[[], float] = time.monotonic):
        self._now = now
        self._lock = threading.Lock()
        self._start = now()
        self._engine_s = 0.0  # closed engine-wait spans
        self._waiting = 0  # requests waiting now
        self._since = 0.0  # start of the open engine-wait span

    @contextmanager
    def engine_wait(self) -> Iterator[None]:
        """Pause the clock while the block runs (nested or concurrent blocks: until the last ends)."""
        with self._lock:
            if self._waiting == 0:
                self._since = self._now()
            self._waiting += 1
        try:
            yield
        finally:
            with self._lock:
                self._waiting -= 1
                if self._waiting == 0:
                    self._engine_s += self._now() - self._since

    @property
    def paused(self) -> bool:
        """Whether a request is waiting for the engine now."""
        with self._lock:
            return self._waiting > 0

    def own_s(self) -> float:
        """The episode's own seconds so far (they do not grow while :attr:`paused`)."""
        with self._lock:
            now = self._now()
            engine = self._engine_s + (now - self._since if self._waiting else 0.0)
            return now - self._start - engine

    def engine_s(self) -> float:
        """Seconds so far during which a request of the episode waited for the engine."""
        with self._lock:
            return self._engine_s + (self._now() - self._since if self._waiting else 0.0)
