"""A role's saved weights as one sha256: what "two runs give bitwise identical weights" is checked
with (``run.deterministic``, ``rollout.replay``; docs/reproducibility.md).

:func:`checkpoint_hash` reads every tensor a role saved in a checkpoint (``<run_dir>/checkpoints/
step_XXXXXX/roles/<role>/``) or a model directory (``<run_dir>/hf/``): the tensors of each
``*.safetensors`` file and of a torch.distributed.checkpoint (DCP) directory, loaded without
running a pickle (:mod:`rlweave.backend_helpers.safe_dcp`). They are hashed in a canonical order
(by file, then by name) with their dtype and shape, so files that differ only in what DCP records
about the save (its ``.metadata`` pickle: paths, ids) hash the same. Non-tensor items (an
optimizer's param-group settings) are left out.

``python -m rlweave.backend_helpers.weights_hash PATH [ROLE]`` prints the hash. torch is imported when
called.
"""

from __future__ import annotations

import hashlib
import sys
import warnings
from pathlib import Path
from typing import Any

DCP_METADATA = ".metadata"


def _update(h: Any, label: str, tensor: Any) -> None:
    import torch

    t = tensor.detach().cpu().contiguous()
    h.update(f"{label}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def _dcp_tensors(folder: Path) -> dict[str, Any]:
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from rlweave.backend_helpers import safe_dcp

    md = safe_dcp.read_metadata(folder)
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in md.state_dict_metadata.items()
             if isinstance(m, TensorStorageMetadata)}
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized": one process reads it, as meant
        warnings.simplefilter("ignore", UserWarning)
        safe_dcp.load(state, folder)
    return state


def checkpoint_hash(path: str | Path, role: str = "policy") -> str:
    """sha256 of the tensors saved under ``path``: a checkpoint step directory (its
    ``roles/<role>/`` is read), a role's folder in one, or a model directory. Raises
    ``FileNotFoundError`` when ``path`` holds no tensors."""
    from safetensors import safe_open

    root = Path(path)
    if (root / "roles" / role).is_dir():
        root = root / "roles" / role
    h = hashlib.sha256()
    found = 0
    for folder in sorted({root, *(p.parent for p in root.rglob(DCP_METADATA))}):
        if (folder / DCP_METADATA).is_file():
            for name, t in sorted(_dcp_tensors(folder).items()):
                _update(h, f"{folder.relative_to(root).as_posix()}:{name}", t)
                found += 1
    for f in sorted(root.rglob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in sorted(st.keys()):
                _update(h, f"{f.relative_to(root).as_posix()}:{name}", st.get_tensor(name))
                found += 1
    if not found:
        raise FileNotFoundError(f"no saved tensors under {root}")
    return h.hexdigest()


if __name__ == "__main__":  # pragma: no cover - a convenience for people comparing runs
    print(checkpoint_hash(sys.argv[1], *sys.argv[2:3]))
