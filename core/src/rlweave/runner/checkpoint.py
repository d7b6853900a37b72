"""Atomic, verifiable checkpoint directories with keep-last-k retention.

Layout under ``root``: ``step_000010/`` (complete: holds a ``COMPLETE`` marker),
``.tmp-step_000010/`` (being written). Contract:

1. :meth:`CheckpointManager.begin` returns a fresh temporary directory; the caller writes
   everything (model, optimizer, RNG, data position, algorithm state) into it, as JSON,
   safetensors or tensor shards (a backend's own format, loaded without running code: the
   FSDP backend's DCP metadata goes through an allow-listed unpickler). Loaders refuse a
   pickle in a checkpoint (:func:`read_state_json`, :func:`refuse_pickle`), never run it.
2. :meth:`CheckpointManager.commit` fsyncs, renames it to ``step_XXXXXX`` and then writes the
   ``COMPLETE`` marker (to a temporary name, fsynced, renamed). The marker is JSON:
   ``{"format": 1, "step", "time", "files": {path: {"size", "xxh3_128"}}}`` listing every file
   of the checkpoint with its checksum (:mod:`rlweave.runner.manifest`). A crash at any point
   before the rename of the marker leaves nothing that :meth:`complete` lists; leftovers are
   removed by the next manager or ``begin``.
3. :meth:`CheckpointManager.resumable` is what a resume loads: the newest complete checkpoint
   whose files all match its marker (:meth:`verify`). Each newer one that does not is skipped
   with a warning naming its damaged, missing or added files; when complete checkpoints exist
   and none verifies it raises :class:`CheckpointError` listing them all, so a damaged
   checkpoint is never loaded. A marker without a file list (written by rlweave before
   checksums; such checkpoints also hold pickles, which nothing loads any more) counts as
   unverifiable, with that reason in the message.
4. Retention keeps the newest ``keep_last`` complete checkpoints; it never deletes the newest
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

from rlweave.data.checkpoint_files import (  # noqa: F401 - re-exported: this module's names since before the move
    CheckpointError, read_json, read_state_json, refuse_pickle, write_json)
from rlweave.runner import manifest

log = logging.getLogger("rlweave.checkpoint")

MARKER = "COMPLETE"
#: the marker's temporary name while it is written (never listed, never complete)
_MARKER_TMP = ".COMPLETE.tmp"
#: ``format`` of markers that list files; markers without ``files`` are from before checksums
MARKER_FORMAT = 1
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


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every complete checkpoint (``step_XXXXXX`` with its marker) under
    ``root``, oldest first, unverified; reads only (none when ``root`` does not exist)."""
    root = Path(root)
    out = []
    for p in root.iterdir() if root.is_dir() else []:
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / MARKER).is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)


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
        return complete_checkpoints(self.root)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or ``None`` (unverified: resume with :meth:`resumable`)."""
        done = self.complete()
        return done[-1][1] if done else None

    @staticmethod
    def verify(path: str | Path) -> list[str]:
        """Problems of the complete checkpoint ``path`` (empty: every file listed in its marker
        is there with its size and checksum, and no other file is). Each names the file."""
        path = Path(path)
        try:
            marker = read_json(path / MARKER)
        except (OSError, ValueError) as exc:
            return [f"{MARKER}: unreadable ({exc})"]
        if not isinstance(marker, dict):
            return [f"{MARKER}: not a JSON object"]
        if "files" not in marker:
            return [(f"{MARKER} lists no files (written by an rlweave without checkpoint checksums): its files "
                     "cannot be verified")]
        return manifest.check(path, marker["files"], exclude=(MARKER, _MARKER_TMP))

    def resumable(self) -> Path | None:
        """The newest complete checkpoint that verifies, or ``None`` when there is no complete one.

        Newer complete checkpoints that do not verify are skipped, each with a warning naming
        its problems. Raises :class:`CheckpointError` (naming every checkpoint and file) when
        complete checkpoints exist and none verifies."""
        done = self.complete()
        failed: list[str] = []
        for i, (_, path) in enumerate(reversed(done)):
            problems = self.verify(path)
            if not problems:
                return path
            what = f"{path.name}: " + "; ".join(problems)
            failed.append(what)
            if i + 1 < len(done):
                log.warning("checkpoint %s is not used: %s; falling back to the previous complete checkpoint",
                            path, "; ".join(problems))
        if failed:
            raise CheckpointError(f"no complete checkpoint in {self.root} verifies, so none is loaded: "
                                  + " | ".join(failed))
        return None

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
        """Publish ``tmp`` as checkpoint ``step``: fsync, checksum every file, rename, marker
        (listing the files, atomically), then retention. ``info`` adds keys to the marker."""
        tmp = Path(tmp)
        if not tmp.is_dir():
            raise FileNotFoundError(f"checkpoint temp directory missing: {tmp}")
        final = self.path_for(step)
        _fsync_tree(tmp)
        files = manifest.build(tmp, exclude=(MARKER, _MARKER_TMP))
        if final.exists():  # re-saving a step (e.g. after resume): retire the old one first
            trash = self.root / f".trash-{final.name}"
            shutil.rmtree(trash, ignore_errors=True)
            (final / MARKER).unlink(missing_ok=True)
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        marker = {**(info or {}), "format": MARKER_FORMAT, "step": step, "time": time.time(), "files": files}
        with open(final / _MARKER_TMP, "w", encoding="utf-8") as f:
            json.dump(marker, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(final / _MARKER_TMP, final / MARKER)
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
