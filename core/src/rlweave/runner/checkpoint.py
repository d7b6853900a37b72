"""Atomic checkpoint directories with keep-last-k retention.

Layout under ``root``: ``step_000010/`` (complete: holds a ``COMPLETE`` marker),
``.tmp-step_000010/`` (being written). Contract:

1. :meth:`CheckpointManager.begin` returns a fresh temporary directory; the caller writes
   everything (model, optimizer, RNG, data position, algorithm state) into it.
2. :meth:`CheckpointManager.commit` fsyncs, renames it to ``step_XXXXXX`` and then writes the
   ``COMPLETE`` marker (fsynced). A crash at any point before the marker leaves nothing that
   :meth:`latest` returns; leftovers are removed by the next manager or ``begin``.
3. Retention keeps the newest ``keep_last`` complete checkpoints; it never deletes the newest
   one (so never the only complete one), and removes the marker before the files so a crash
   mid-delete cannot leave a half-deleted checkpoint that looks complete.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("rlweave.checkpoint")

MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    os.fsync(f.fileno())
            except OSError:
                pass
        _fsync_dir(Path(dirpath))


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


class CheckpointManager:
    """Checkpoints of one run under ``root`` (see module docstring).

    Args:
        root: folder holding the ``step_*`` directories (created if missing).
        keep_last: complete checkpoints to keep (>= 1).
    """

    def __init__(self, root: str | Path, keep_last: int = 2) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last
        self.root.mkdir(parents=True, exist_ok=True)
        self.clean_incomplete()

    @staticmethod
    def step_dir_name(step: int) -> str:
        return f"step_{step:06d}"

    def path_for(self, step: int) -> Path:
        return self.root / self.step_dir_name(step)

    @staticmethod
    def step_of(path: str | Path) -> int:
        """Step number of a ``step_XXXXXX`` directory."""
        m = _STEP_DIR.match(Path(path).name)
        if not m:
            raise ValueError(f"not a checkpoint directory: {path}")
        return int(m.group(1))

    @staticmethod
    def is_complete(path: str | Path) -> bool:
        return (Path(path) / MARKER).is_file()

    def complete(self) -> list[tuple[int, Path]]:
        """``(step, path)`` of every complete checkpoint, oldest first."""
        out = []
        for p in self.root.iterdir() if self.root.is_dir() else []:
            m = _STEP_DIR.match(p.name)
            if m and p.is_dir() and self.is_complete(p):
                out.append((int(m.group(1)), p))
        return sorted(out)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or ``None``."""
        done = self.complete()
        return done[-1][1] if done else None

    def clean_incomplete(self) -> list[Path]:
        """Remove ``.tmp-*`` leftovers and ``step_*`` directories without a marker."""
        removed = []
        for p in list(self.root.iterdir()):
            if p.is_dir() and (p.name.startswith(".tmp-") or p.name.startswith(".trash-")
                               or (_STEP_DIR.match(p.name) and not self.is_complete(p))):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
        if removed:
            log.warning("removed incomplete checkpoint(s): %s", ", ".join(p.name for p in removed))
        return removed

    def begin(self, step: int) -> Path:
        """A fresh, empty ``.tmp-step_XXXXXX`` directory to write checkpoint ``step`` into."""
        tmp = self.root / f".tmp-{self.step_dir_name(step)}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: str | Path, step: int, info: dict[str, Any] | None = None) -> Path:
        """Publish ``tmp`` as checkpoint ``step``: fsync, rename, marker, then retention."""
        tmp = Path(tmp)
        if not tmp.is_dir():
            raise FileNotFoundError(f"checkpoint temp directory missing: {tmp}")
        final = self.path_for(step)
        _fsync_tree(tmp)
        if final.exists():  # re-saving a step (e.g. after resume): retire the old one first
            trash = self.root / f".trash-{final.name}"
            shutil.rmtree(trash, ignore_errors=True)
            (final / MARKER).unlink(missing_ok=True)
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        with open(final / MARKER, "w", encoding="utf-8") as f:
            json.dump({"step": step, "time": time.time(), **(info or {})}, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(final)
        self.apply_retention()
        return final

    def apply_retention(self) -> list[Path]:
        """Delete complete checkpoints beyond the newest ``keep_last``; never the newest."""
        done = self.complete()
        doomed = [p for _, p in done[: max(0, len(done) - self.keep_last)]]
        for p in doomed:
            if p == done[-1][1]:
                continue
            (p / MARKER).unlink(missing_ok=True)  # un-publish first: a crash mid-delete stays invisible
            shutil.rmtree(p, ignore_errors=True)
        return doomed
