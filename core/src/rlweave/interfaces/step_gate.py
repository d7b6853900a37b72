"""``StepGate``: where an engine's decoding steps and its weight updates take turns.

An engine that accepts weights while it generates (``RolloutEngine.control_plane``) holds
the gate with :meth:`StepGate.running` for the whole ``generate`` call and calls
:meth:`StepGate.boundary` between two decoding steps; a weight update, from another thread
(the rank's control channel), runs inside :meth:`StepGate.update`. Contract:

* an update never runs while a step does: it starts when no call is running, or when every
  running call has reached a boundary;
* an update that waits goes first: a running call stops at its next boundary until the
  update is done (so a busy engine cannot starve it), then continues with the new weights;
  a call that starts while an update waits or runs waits for it;
* :meth:`update` is reentrant on the thread that holds it (``load_weights`` inside a sync
  that already holds the gate).

A call whose engine cannot stop between steps simply never calls :meth:`boundary`: an
update then waits for the call's end.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class StepGate:
    """See the module docstring. ``updates`` counts the updates made; ``landed_in_call``
    those that landed while a call was running (at a boundary)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._stepping = 0  # running calls not parked at a boundary
        self._parked = 0  # running calls parked at a boundary
        self._waiting = 0  # updates waiting for the steps to stop
        self._owner: int | None = None  # thread id of the update in progress
        self._depth = 0
        self.updates = 0
        self.landed_in_call = 0

    @contextmanager
    def running(self) -> Iterator[None]:
        """Held by a ``generate`` call from its first step to its last."""
        with self._cond:
            self._cond.wait_for(lambda: self._owner is None and not self._waiting)
            self._stepping += 1
        try:
            yield
        finally:
            with self._cond:
                self._stepping -= 1
                self._cond.notify_all()

    def boundary(self) -> bool:
        """Between two decoding steps of a running call: let waiting updates run first.
        Returns True when weights changed here."""
        with self._cond:
            if not self._waiting and self._owner is None:
                return False
            before = self.updates
            self._stepping -= 1
            self._parked += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._owner is None and not self._waiting)
            self._parked -= 1
            self._stepping += 1
            return self.updates != before

    @contextmanager
    def update(self) -> Iterator[None]:
        """Held while new weights are loaded: waits until no step runs (see the contract)."""
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                reentered = True
            else:
                reentered = False
                self._waiting += 1
                try:
                    self._cond.wait_for(lambda: self._owner is None and not self._stepping)
                finally:
                    self._waiting -= 1
                self._owner, self._depth = me, 1
                if self._parked:
                    self.landed_in_call += 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if not reentered and self._depth == 0:
                    self._owner = None
                    self.updates += 1
                    self._cond.notify_all()

    @property
    def update_waiting(self) -> bool:
        """True while an update waits for the steps to stop or runs (a :meth:`boundary` now
        would park)."""
        with self._cond:
            return bool(self._waiting or self._owner is not None)

    @property
    def busy(self) -> bool:
        """True while a call runs (stepping or parked)."""
        with self._cond:
            return bool(self._stepping or self._parked)
