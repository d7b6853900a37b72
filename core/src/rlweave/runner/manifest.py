"""The file list of a checkpoint: every file with its size and checksum.

A checkpoint's ``COMPLETE`` marker carries the manifest of its directory (see
:mod:`rlweave.runner.checkpoint`): ``{relative posix path: {"size": bytes, "xxh3_128": hex}}``
for every regular file under it except the marker itself. :func:`build` computes it by
streaming each file (1 MiB reads, xxHash's XXH3-128, fast enough to read at disk speed);
:func:`check` compares a directory with one and returns one line per problem: a file missing,
of another size, with another checksum (damaged), or not listed (added afterwards). A
checksum detects damage, not tampering: whoever can write the files can rewrite the marker
too, which is why loaders never unpickle anything from a checkpoint either.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

import xxhash

#: the key of the checksum in a manifest entry (names the algorithm)
HASH_KEY = "xxh3_128"
_CHUNK = 1 << 20


def checksum(path: str | os.PathLike[str]) -> str:
    """XXH3-128 of the file's bytes as 32 hex digits (streamed)."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def files(root: str | os.PathLike[str], exclude: tuple[str, ...] = ()) -> list[str]:
    """Relative posix paths of the regular files under ``root``, sorted; top-level names in
    ``exclude`` are left out."""
    root = Path(root)
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if rel not in exclude:
                out.append(rel)
    return sorted(out)


def build(root: str | os.PathLike[str], exclude: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """The manifest of ``root``: ``{relative path: {"size": int, "xxh3_128": str}}``."""
    root = Path(root)
    out = {}
    for rel in files(root, exclude):
        p = root / rel
        out[rel] = {"size": p.stat().st_size, HASH_KEY: checksum(p)}
    return out


def _safe_relative(rel: str) -> bool:
    p = PurePosixPath(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts and "\\" not in rel


def check(root: str | os.PathLike[str], manifest: Any, exclude: tuple[str, ...] = ()) -> list[str]:
    """Problems of ``root`` against ``manifest`` (empty: every file is there, intact, and
    nothing was added). Each line names the file relative to ``root``."""
    root = Path(root)
    if not isinstance(manifest, dict):
        return ["the file list is not a mapping"]
    problems = []
    for rel, entry in sorted(manifest.items()):
        if not (isinstance(rel, str) and _safe_relative(rel)) or not isinstance(entry, dict):
            problems.append(f"{rel!r}: not a valid file entry")
            continue
        p = root / rel
        if not p.is_file():
            problems.append(f"{rel}: missing")
            continue
        size = p.stat().st_size
        if size != entry.get("size"):
            problems.append(f"{rel}: {size} bytes, {entry.get('size')} when it was written (truncated or damaged)")
        elif checksum(p) != entry.get(HASH_KEY):
            problems.append(f"{rel}: checksum mismatch (damaged)")
    for rel in files(root, exclude):
        if rel not in manifest:
            problems.append(f"{rel}: not listed (added after the checkpoint was written)")
    return problems
