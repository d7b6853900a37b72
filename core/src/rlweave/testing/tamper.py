"""Damage and booby-trap checkpoints, for tests that show they are detected or refused.

* :func:`malicious_pickle`: bytes that, when unpickled, create ``marker`` (through
  ``os.system``); a test plants them and then checks ``marker`` never appeared.
* :func:`flip_bytes`: invert ``n`` bytes in the middle of a file (simulated bit rot).
* :func:`reseal`: rewrite a checkpoint's ``COMPLETE`` marker so its checksums match the
  files again, as someone who changed the files on purpose would; the loaders, not the
  checksums, must then refuse what was planted.

Stdlib only (``torch_format=True`` imports torch).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shlex
from pathlib import Path


class _Trap:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


def malicious_pickle(marker: str | os.PathLike[str], torch_format: bool = False) -> bytes:
    """A pickle (``torch.save``'s zip format with ``torch_format``) that runs
    ``touch MARKER`` when loaded by ``pickle.load`` (or ``torch.load(weights_only=False)``)."""
    trap = _Trap(str(marker))
    if not torch_format:
        return pickle.dumps(trap, protocol=4)
    import torch

    buf = io.BytesIO()
    torch.save(trap, buf)
    return buf.getvalue()


def flip_bytes(path: str | os.PathLike[str], n: int = 64, offset: int | None = None) -> int:
    """Invert ``n`` bytes of ``path`` starting at ``offset`` (default: the middle); returns
    the offset used."""
    path = Path(path)
    data = bytearray(path.read_bytes())
    if len(data) < n:
        raise ValueError(f"{path} has {len(data)} bytes, fewer than {n}")
    start = (len(data) - n) // 2 if offset is None else offset
    for i in range(start, start + n):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return start


def reseal(ckpt_dir: str | os.PathLike[str]) -> None:
    """Rewrite ``ckpt_dir/COMPLETE`` so it lists the directory's current files and checksums."""
    from rlweave.runner import manifest
    from rlweave.runner.checkpoint import MARKER

    ckpt_dir = Path(ckpt_dir)
    marker = json.loads((ckpt_dir / MARKER).read_text())
    marker["files"] = manifest.build(ckpt_dir, exclude=(MARKER,))
    (ckpt_dir / MARKER).write_text(json.dumps(marker))
