"""The run's error log: ``<run_dir>/logs/errors.log``.

When user or plugin code fails inside a run (:class:`~rlweave.interfaces.failures.PluginCodeError`:
an environment; :class:`~rlweave.rewards.failures.RewardFailureError`: a reward failing too often),
the command line prints one line; the full traceback goes here, appended with the UTC time and
that line, and the error's ``log_file`` names this file so the line can point at it.
"""

from __future__ import annotations

import time
from pathlib import Path

from rlweave.interfaces.failures import PluginCodeError
from rlweave.rewards.failures import RewardFailureError

#: the failures whose traceback (``details``) goes to the error log
LOGGED = (PluginCodeError, RewardFailureError)
#: the error log, relative to the run directory
ERROR_LOG = Path("logs") / "errors.log"


def write_error_log(run_dir: str | Path, exc: PluginCodeError | RewardFailureError) -> Path:
    """Append ``exc`` (its line and its traceback) to the run's error log, set ``exc.log_file``
    and return the file. Never raises: a log that cannot be written leaves ``log_file`` None."""
    path = Path(run_dir) / ERROR_LOG
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with path.open("a", encoding="utf-8") as f:
            f.write(f"{stamp} {exc}\n{exc.details.rstrip()}\n\n")
    except OSError:
        return path
    exc.log_file = str(path)
    return path
