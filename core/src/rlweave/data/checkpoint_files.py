"""Files in a checkpoint directory, written and read without pickles.

:func:`write_json` writes atomically (temporary file, fsync, rename); :func:`read_state_json`
reads a state file and refuses a pickle in its place; :func:`refuse_pickle` builds the error
for a state held only as a pickle; :class:`CheckpointError` is what every checkpoint reader
raises for a file it will not load. The run's checkpoint manager
(:mod:`rlweave.runner.checkpoint`) and the training backends' helpers
(:mod:`rlweave.backend_helpers`) share them; standard library only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file and rename (fsynced)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str | Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used: damaged, unverifiable, or holding state in a form that is
    not loaded (e.g. a pickle). The message names the checkpoint and the file(s); nothing of
    it was loaded into a run when this is raised by a check before loading."""


def _looks_pickled(path: Path) -> bool:
    """True when ``path`` starts like a pickle (protocol 2+) or a ``torch.save`` zip archive."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head[:1] == b"\x80" or head == b"PK\x03\x04"


def read_state_json(path: str | Path) -> Any:
    """The JSON value of the checkpoint file ``path``; :class:`CheckpointError` naming the
    file when it is missing or not JSON (a pickle in its place is called one, never loaded)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, ValueError) as exc:
        kind = "a pickle, which is never loaded (unpickling can run code)" if _looks_pickled(path) else f"not JSON ({exc})"
        raise CheckpointError(f"checkpoint file {path} is {kind}; refusing to load it") from None


def refuse_pickle(path: str | Path, holds: str) -> CheckpointError:
    """The error for a checkpoint whose ``holds`` state is only in the pickle ``path`` (a
    file format of rlweave before checkpoints were pickle-free, or a foreign file)."""
    return CheckpointError(f"checkpoint file {path} holds {holds} as a pickle (the format of rlweave before "
                           "checkpoints were pickle-free, or a foreign file); pickles from checkpoints are never "
                           "loaded because unpickling can run code. Resume from a checkpoint written by this "
                           "version, or start a fresh run")
