"""Each rank's own output in a file of the run: ``<run_dir>/logs/<role>-<rank>.log``.

What a rank's process prints (the backend's and the engine's warnings, progress bars, the
output of processes it starts, such as an inference engine's engine process) is not the
user's console: the scheduler points the process's standard output and error at that file
when the rank starts (:func:`redirect_output`, at the file-descriptor level, so native code
and child processes write there too), and an error about the rank names it
(``WorkerError.log_file``). The file is appended to: a rank rebuilt after a lost worker
writes on. Standard library only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: the folder of the run directory holding the ranks' output
LOGS = "logs"
#: set to 1 (``rlweave train --verbose``): the ranks print to the console as well (Ray's own
#: forwarding of worker output), their files are not written
VERBOSE_ENV = "RLWEAVE_VERBOSE"


def rank_log(run_dir: str | os.PathLike[str], role: str, rank: int) -> Path:
    """The file rank ``rank`` of ``role`` writes its output to."""
    return Path(run_dir) / LOGS / f"{role}-{rank}.log"


def redirect_output(path: str | os.PathLike[str]) -> None:
    """Send this process's standard output and error (file descriptors 1 and 2, and so
    ``sys.stdout``/``sys.stderr`` and every child started from now on) to ``path``, appended
    to; its folder is made when missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
