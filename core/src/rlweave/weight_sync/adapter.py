"""Adapter transport (``weight_sync.lora: adapter``): a LoRA policy sends only its adapter.

Where the rollout engine serves LoRA adapters itself (its record says ``lora``; vLLM), a sync
ships the adapter instead of the merged full weights: every source rank calls
``save_adapter(folder)`` (rank 0 writes a PEFT adapter directory under the run directory, which
the run checked is shared by every rank), the controller hashes its ``adapter_model.safetensors``
(SHA-256), and every destination rank calls ``load_adapter(folder, sha256)``: it verifies the
file and serves every later request with that adapter on the base model. Each sync writes a new
folder (a new adapter id for the engine, so nothing it cached is reused); the one before the
newest is removed once the newest is loaded. The pair's folder (``<run_dir>/weight_sync/<src>-<dst>``)
is scratch: the first sync of a process empties it.

The payload is the adapter (rank x (in + out) per adapted layer) instead of the whole model; the
engine computes ``B @ A`` beside each adapted matmul at every step instead of once per sync.
Errors and timeouts follow :mod:`rlweave.weight_sync.interface`.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlweave.weight_sync.interface import WeightSyncError, WeightSyncTimeout, WeightTransport, from_worker_error

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.scheduler.handle import RoleHandle

ADAPTER_FILE = "adapter_model.safetensors"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_adapter(folder: str | Path, sha256: str, where: str) -> Path:
    """The adapter file in ``folder``, after checking it has the SHA-256 ``sha256`` the sender
    computed; a missing or different file raises :class:`WeightSyncError` naming ``where`` (the
    receiving rank's engine)."""
    weights = Path(folder) / ADAPTER_FILE
    got = file_sha256(weights) if weights.is_file() else "(missing)"
    if got != sha256:
        raise WeightSyncError(f"{where}: adapter {weights}: SHA-256 {got} differs from the sender's {sha256}")
    return weights


class AdapterTransport(WeightTransport):
    """Syncs a LoRA adapter through folders under ``folder`` (see the module docstring)."""

    name = "adapter"

    def __init__(self, timeout_s: float = 900.0, folder: str | Path | None = None):
        super().__init__(timeout_s)
        if folder is None:
            raise ValueError("weight_sync.lora 'adapter' needs a folder shared by the roles (the run directory)")
        self.folder = Path(folder)
        self.count = 0
        self.current: Path | None = None

    def sync(self, src: RoleHandle, dst: RoleHandle, bucket_bytes: int, timeout_s: float) -> dict[str, Any]:
        from rlweave.worker_errors import WorkerError, WorkerTimeout

        t0 = time.perf_counter()
        if self.count == 0:  # this pair's scratch folder: what an earlier process of the run left goes
            shutil.rmtree(self.folder, ignore_errors=True)
        self.count += 1
        path = self.folder / f"adapter-{self.count:06d}"
        deadline = t0 + timeout_s

        def wait(fut: Any, role: RoleHandle, what: str) -> Any:
            try:
                return fut.result(timeout=max(1.0, deadline - time.perf_counter()))
            except WorkerTimeout as exc:
                raise WeightSyncTimeout(f"adapter sync: {what} on role {role.name} did not finish within "
                                        f"{timeout_s:.0f} s: {exc}") from exc
            except WorkerError as exc:
                raise from_worker_error(exc, f"adapter sync: {what} on role {role.name}") from exc

        wait(src.call("save_adapter", str(path)), src, "save_adapter")
        weights = path / ADAPTER_FILE
        if not weights.is_file():
            raise WeightSyncError(f"adapter sync: role {src.name} wrote no {weights}")
        digest = file_sha256(weights)
        wait(dst.call("load_adapter", str(path), digest), dst, "load_adapter")
        previous, self.current = self.current, path
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        seconds = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        return {"bytes": size, "tensors": _tensor_count(weights), "buckets": 1, "seconds": seconds,
                "bytes_per_s": size / seconds if seconds > 0 else 0.0, "format": "adapter"}

    def close(self) -> None:
        """The folders stay until the run ends; the newest is what the engine serves."""


def _tensor_count(path: Path) -> int:
    import json
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return len([k for k in header if k != "__metadata__"])
