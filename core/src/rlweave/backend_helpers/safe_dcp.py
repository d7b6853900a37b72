"""Loading torch.distributed.checkpoint (DCP) directories without running their pickles.

torch 2.13's DCP unpickles two things when it loads from a directory:

* the ``.metadata`` file: ``FileSystemReader.read_metadata`` runs plain ``pickle.load`` on it;
* BYTE_IO items, the non-tensor values of a state dict (AdamW's param-group ``lr``,
  ``betas``, ``params`` ...): ``DefaultLoadPlanner.load_bytes`` runs
  ``torch.load(weights_only=False)`` on them.

(Tensor items it reads with ``torch.load(weights_only=True)`` already.) A checkpoint directory
from elsewhere could thus run code. Here instead:

* :func:`read_metadata` unpickles ``.metadata`` with an unpickler that admits only DCP's own
  metadata classes, ``torch.Size``, torch dtypes and layouts and ``pathlib`` paths, checks
  that the result is DCP ``Metadata`` and that every storage entry names a plain file inside
  the checkpoint; :class:`SafeReader` hands DCP that result;
* :class:`SafePlanner` reads BYTE_IO items with ``torch.load(weights_only=True)`` (plain
  Python values and tensors only);
* :func:`load` runs ``dcp.load`` with both and turns any failure into
  :class:`~rlweave.data.checkpoint_files.CheckpointError` naming the file or item.

Anything else raises ``CheckpointError``; nothing outside the allow list is ever imported
or called while loading.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from rlweave.data.checkpoint_files import CheckpointError
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

METADATA = ".metadata"
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
#: (module, name) the metadata unpickler may import; anything else is refused
ALLOWED = frozenset({
    *((_DCP_METADATA, n) for n in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                   "ChunkStorageMetadata", "TensorProperties", "MetadataIndex", "StorageMeta",
                                   "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a lookup of torch.layout objects by name
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
})


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, f, source: Path):
        super().__init__(f)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointError(f"checkpoint file {self.source} wants to import {module}.{name}, which is not "
                              "DCP metadata; refusing to unpickle it (unpickling can run code)")


def read_metadata(path: str | Path) -> Metadata:
    """The DCP metadata of checkpoint directory ``path``, unpickled with the allow list and
    checked; :class:`CheckpointError` naming the file otherwise."""
    f = Path(path) / METADATA
    if not f.is_file():
        raise CheckpointError(f"checkpoint file {f} is missing (not a DCP checkpoint)")
    try:
        with open(f, "rb") as stream:
            md = _MetadataUnpickler(stream, f).load()
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is a refused file
        raise CheckpointError(f"checkpoint file {f} is not valid DCP metadata ({type(exc).__name__}: {exc})") from None
    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict):
        raise CheckpointError(f"checkpoint file {f} is not DCP metadata (found {type(md).__name__})")
    for index, info in (md.storage_data or {}).items():
        rel = getattr(info, "relative_path", None)
        if not (isinstance(rel, str) and rel and PurePosixPath(rel).name == rel and rel not in (".", "..")
                and "\\" not in rel):
            raise CheckpointError(f"checkpoint file {f}: item {getattr(index, 'fqn', index)!r} points at {rel!r}, "
                                  "not a file of the checkpoint directory")
    return md


class SafeReader(FileSystemReader):
    """A ``FileSystemReader`` whose metadata comes from :func:`read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise CheckpointError(f"{self.path}: per-rank DCP metadata files are not supported")
        md = read_metadata(self.path)
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


class SafePlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` reading non-tensor items with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - weights_only refuses anything but plain values
            found = re.search(r"GLOBAL (\S+)", str(exc))
            why = f"it wants to import {found.group(1)}" if found else f"{type(exc).__name__}"
            info = (getattr(getattr(self, "metadata", None), "storage_data", None) or {}).get(read_item.storage_index)
            where = f" in {info.relative_path}" if info is not None else ""
            raise CheckpointError(f"DCP item {fqn!r}{where} is not a plain value ({why}); refusing to unpickle it "
                                  "(unpickling can run code)") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def _first_error(exc: BaseException) -> BaseException | None:
    failures = getattr(exc, "failures", None) or {}
    for rank in sorted(failures):
        inner = failures[rank][0] if isinstance(failures[rank], tuple) else failures[rank]
        if isinstance(inner, CheckpointError):
            return inner
    for rank in sorted(failures):
        return failures[rank][0] if isinstance(failures[rank], tuple) else failures[rank]
    return None


def load(state: dict, path: str | Path) -> None:
    """``dcp.load(state)`` from ``path`` with :class:`SafeReader` and :class:`SafePlanner`; a
    refused or unreadable file raises :class:`CheckpointError` (no DCP traceback)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=SafeReader(str(path)), planner=SafePlanner())
    except CheckpointException as exc:
        inner = _first_error(exc)
        if isinstance(inner, CheckpointError):
            raise CheckpointError(f"checkpoint {path}: {inner}") from None
        what = f"{type(inner).__name__}: {inner}" if inner is not None else str(exc).splitlines()[0]
        raise CheckpointError(f"checkpoint {path}: DCP could not load it ({what})") from None
