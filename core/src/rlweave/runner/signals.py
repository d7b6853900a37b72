"""SIGTERM and SIGINT during a run: an exception, so that the run's clean-up runs.

:class:`Signals` (a context manager around a run) turns either signal into
:class:`RunInterrupted`; the runner shuts every worker, reward process and Ray down as it
propagates, and the CLI exits with ``128 + signum``.
"""

from __future__ import annotations

import signal
from typing import Any


class RunInterrupted(RuntimeError):
    """The run got SIGTERM/SIGINT (``signum``); everything is shut down as this propagates."""

    def __init__(self, message: str, signum: int = 0):
        super().__init__(message)
        self.signum = signum


class Signals:
    """Turn SIGTERM (and SIGINT) into an exception so the ``finally`` clean-up runs.

    ``ray.init`` installs its own SIGTERM handler in the driver, so the run calls
    :meth:`reinstall` once Ray is up."""

    active: "Signals | None" = None

    def __init__(self) -> None:
        self.old: dict[int, Any] = {}

    @staticmethod
    def _handler(signum, frame):  # noqa: ARG004
        raise RunInterrupted(f"received signal {signal.Signals(signum).name}; shutting down", signum)

    def __enter__(self) -> "Signals":
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self.old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: leave signals alone
                pass
        Signals.active = self
        return self

    def reinstall(self) -> None:
        """Take SIGTERM/SIGINT back from whatever replaced our handler (Ray does)."""
        for sig in self.old:
            signal.signal(sig, self._handler)

    def __exit__(self, *exc: object) -> None:
        Signals.active = None
        for sig, old in self.old.items():
            signal.signal(sig, old)
