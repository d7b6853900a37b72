"""Test helper: plant bytes as one non-tensor (BYTE_IO) item of a DCP checkpoint (the FSDP
backend's tests and ``tests/reliability/`` load it with
:func:`rlweave.testing.helper_modules.import_helper`).

:func:`plant_byte_item` appends ``payload`` to the shard file holding item ``fqn`` (e.g.
``optim.param_groups.0.lr``) and points the item's storage entry in ``.metadata`` at it, so
that DCP's loader reads ``payload`` where the value was: what someone who wants a checkpoint
to run code on load would do. Used with :func:`rlweave.testing.tamper.malicious_pickle`
(``torch_format=True``) to show the item is refused, not run.
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

from rlweave.backend_helpers import safe_dcp


def byte_items(path: str | Path) -> list[str]:
    """The fqns of the BYTE_IO items of the DCP checkpoint at ``path``."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    md = safe_dcp.read_metadata(path)
    return [k for k, v in md.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)]


def plant_byte_item(path: str | Path, fqn: str, payload: bytes) -> None:
    """Make item ``fqn`` of the DCP checkpoint at ``path`` read as ``payload``."""
    path = Path(path)
    md = safe_dcp.read_metadata(path)
    keys = [k for k in md.storage_data if k.fqn == fqn]
    if not keys:
        raise KeyError(f"{path}: no stored item {fqn!r}")
    for key in keys:
        info = md.storage_data[key]
        shard = path / info.relative_path
        offset = shard.stat().st_size
        with open(shard, "ab") as f:
            f.write(payload)
        md.storage_data[key] = dataclasses.replace(info, offset=offset, length=len(payload))
    with open(path / safe_dcp.METADATA, "wb") as f:
        pickle.dump(md, f)
