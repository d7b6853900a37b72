"""Reading data files: jsonl, parquet, and directories written by ``datasets``' ``save_to_disk``.

:func:`detect_format` names the format of a path: a directory is a Hugging Face dataset saved
with ``Dataset.save_to_disk`` (``state.json`` + ``dataset_info.json``; a ``DatasetDict``
directory is refused with the splits it holds: point at one of them, e.g. ``<dir>/train``), a
file ending in ``.parquet`` (or starting with parquet's ``PAR1`` magic) is parquet, any other
file is jsonl. :func:`iter_rows` yields ``(location, record)`` in file order, where location
is ``"line N"`` (jsonl, 1-based line number) or ``"row N"`` (parquet and datasets, 0-based
row index); :func:`default_id` is the stable id of a record without its own ``id``. A table
has one schema for all rows, so a row of a parquet file or saved dataset leaves out the
columns that are null in it (a null is a missing field, as in jsonl). Image columns of a saved
dataset are read as stored, ``{"bytes", "path"}`` mappings, not decoded.

Problems raise :class:`DataError`, one line naming the file and the record. Parquet needs
``pyarrow`` and saved datasets need ``datasets`` (``pip install 'rlweave[data]'``); both are
imported only when such a file is read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlweave.deps import require

FORMATS = ("jsonl", "parquet", "hf_disk")


class DataError(ValueError):
    """A data file that cannot be used; the message names the file, the record and the field."""


def detect_format(path: str | Path) -> str:
    """``"jsonl"``, ``"parquet"`` or ``"hf_disk"`` (see the module docstring)."""
    p = Path(path)
    if p.is_dir():
        if (p / "dataset_dict.json").is_file():
            try:
                splits = json.loads((p / "dataset_dict.json").read_text(encoding="utf-8")).get("splits", [])
            except (OSError, ValueError, AttributeError):
                splits = []
            example = f"{p / splits[0]}" if splits else f"{p}/<split>"
            raise DataError(f"{p} holds a DatasetDict with splits {', '.join(map(str, splits)) or '(none)'}: "
                            f"point at one split's directory, e.g. {example}")
        if (p / "state.json").is_file():
            return "hf_disk"
        raise DataError(f"{p} is a directory but not a dataset saved with datasets' save_to_disk (no state.json); "
                        "give a jsonl or parquet file, or such a directory")
    if p.suffix.lower() == ".parquet":
        return "parquet"
    try:
        with open(p, "rb") as f:
            if f.read(4) == b"PAR1":
                return "parquet"
    except OSError:
        pass
    return "jsonl"


def default_id(path: str | Path, location: str) -> str:
    """``"<stem>:<line or row number>"``: the id of a record that has none of its own."""
    return f"{Path(path).stem}:{location.split()[-1]}"


def _jsonl(path: Path, limit: int | None) -> Iterator[tuple[str, Any]]:
    n = 0
    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if limit is not None and n >= limit:
                    return
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path} line {lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
                n += 1
                yield f"line {lineno}", rec
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None


def _present(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if v is not None}


def _parquet(path: Path, limit: int | None) -> Iterator[tuple[str, Any]]:
    pq = require("pyarrow.parquet")
    try:
        reader = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        raise DataError(f"{path}: not a readable parquet file: {exc}") from None
    row = 0
    for batch in reader.iter_batches(batch_size=1024):
        for rec in batch.to_pylist():
            if limit is not None and row >= limit:
                return
            yield f"row {row}", _present(rec)
            row += 1


def _hf_disk(path: Path, limit: int | None) -> Iterator[tuple[str, Any]]:
    datasets = require("datasets")
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001
        raise DataError(f"{path}: cannot load the saved dataset: {type(exc).__name__}: {exc}") from None
    n = len(ds) if limit is None else min(limit, len(ds))
    raw = _has_images(ds.features)
    table = ds.with_format("arrow") if raw else ds
    for row in range(n):
        yield f"row {row}", _present(table[row].to_pylist()[0] if raw else ds[row])


def _has_images(feature: Any) -> bool:
    """Whether a dataset's features hold an image column (read undecoded: ``{bytes, path}``)."""
    if type(feature).__name__ == "Image":
        return True
    if isinstance(feature, dict):
        return any(_has_images(f) for f in feature.values())
    if isinstance(feature, (list, tuple)):
        return any(_has_images(f) for f in feature)
    inner = getattr(feature, "feature", None)
    return inner is not None and _has_images(inner)


def iter_rows(path: str | Path, fmt: str | None = None, limit: int | None = None) -> Iterator[tuple[str, Any]]:
    """``(location, record)`` of each record of ``path`` in order (at most ``limit``); blank
    jsonl lines are skipped. Raises :class:`DataError` (bad JSON, unreadable file) or
    ``FileNotFoundError``."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"data file not found: {p}")
    fmt = fmt or detect_format(p)
    readers = {"jsonl": _jsonl, "parquet": _parquet, "hf_disk": _hf_disk}
    if fmt not in readers:
        raise DataError(f"{p}: unknown data format {fmt!r} (known: {', '.join(FORMATS)})")
    return readers[fmt](p, limit)
