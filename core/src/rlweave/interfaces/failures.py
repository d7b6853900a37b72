"""Failures of user or plugin code inside a run (an environment's constructor, ``reset`` or
``step``...), reported as one line.

The toolkit code that calls such code catches what it raises and raises
:class:`PluginCodeError` instead: which object failed (``environment 'my_envs.py:Guess'``),
the config key that selects it, the data record it was working on and the exception's first
line, with the full traceback kept in :attr:`PluginCodeError.details`. The runner writes the
traceback to ``<run_dir>/logs/errors.log`` (:func:`rlweave.runner.error_log.write_error_log`)
and sets :attr:`PluginCodeError.log_file`; ``rlweave train`` prints the one line (with the log
file) and exits with code 1 after every worker is shut down. Light: standard library only.
"""

from __future__ import annotations

import traceback
from typing import Any


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else "(no message)"


class PluginCodeError(RuntimeError):
    """Code of a plugin or of the user raised during a run.

    Attributes:
        what: the object that failed, as users name it (``environment 'tools'``).
        key: the config key that selects it (``algorithm.multi_turn.env.name``).
        record_id: the id of the data record it was working on (None: not known).
        phase: what it was doing (``reset()``, ``step()``, ``the constructor``).
        error: the exception's type and first line.
        details: the full traceback.
        log_file: where the runner wrote ``details`` (None until it did).
    """

    def __init__(self, what: str, key: str, record_id: Any, phase: str, error: str, details: str = "",
                 log_file: str | None = None) -> None:
        self.what, self.key, self.record_id, self.phase = what, key, record_id, phase
        self.error, self.details, self.log_file = error, details, log_file
        super().__init__(what)

    @classmethod
    def wrap(cls, exc: BaseException, what: str, key: str, record_id: Any, phase: str) -> PluginCodeError:
        """The error for ``exc`` raised by ``what`` in ``phase`` on record ``record_id``."""
        return cls(what, key, record_id, phase, _first_line(f"{type(exc).__name__}: {exc}"),
                   "".join(traceback.format_exception(exc)))

    def __str__(self) -> str:
        record = "" if self.record_id is None else f" on record {str(self.record_id)!r}"
        where = f"; full traceback in {self.log_file}" if self.log_file else ""
        return f"{self.what} ({self.key}) failed in {self.phase}{record}: {self.error}{where}"

    def __reduce__(self) -> Any:  # keeps its fields across processes (Ray, multiprocessing)
        return (type(self), (self.what, self.key, self.record_id, self.phase, self.error, self.details, self.log_file))
