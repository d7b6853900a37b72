"""The adapter transport's controller side, with stand-in roles (the real engine: tests/test_lora_run.py)."""

from __future__ import annotations

import pytest
from rlweave.weight_sync.adapter import ADAPTER_FILE, AdapterTransport, file_sha256
from rlweave.weight_sync.interface import WeightSyncError
from rlweave.worker_errors import WorkerError


class _Done:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def result(self, timeout=None):
        if self.error is not None:
            raise self.error
        return self.value


class _Policy:
    name = "policy"

    def call(self, method, folder):
        from pathlib import Path

        import torch
        from safetensors.torch import save_file

        Path(folder).mkdir(parents=True)
        save_file({"a.lora_A.weight": torch.ones(2, 3), "a.lora_B.weight": torch.zeros(3, 2)},
                  str(Path(folder) / ADAPTER_FILE))
        return _Done([None])


class _Engine:
    name = "rollout"

    def __init__(self, fail=False):
        self.loaded, self.fail = [], fail

    def call(self, method, folder, sha256):
        if self.fail:
            return _Done(error=WorkerError("rollout", 0, method, "RuntimeError: no"))
        self.loaded.append((method, folder, sha256))
        return _Done([{}])


def test_each_sync_ships_a_new_checked_adapter_and_keeps_only_the_newest(tmp_path):
    (tmp_path / "pair").mkdir()
    (tmp_path / "pair" / "adapter-000007").mkdir()  # left by an earlier process of the run
    t = AdapterTransport(folder=tmp_path / "pair")
    engine = _Engine()
    first = t.sync(_Policy(), engine, 0, 30.0)
    second = t.sync(_Policy(), engine, 0, 30.0)
    assert [p.name for p in (tmp_path / "pair").iterdir()] == ["adapter-000002"]
    method, folder, digest = engine.loaded[-1]
    assert method == "load_adapter" and folder.endswith("adapter-000002")
    assert digest == file_sha256(tmp_path / "pair" / "adapter-000002" / ADAPTER_FILE)
    assert first["tensors"] == second["tensors"] == 2 and second["format"] == "adapter"


def test_an_engine_error_names_the_role(tmp_path):
    with pytest.raises(WeightSyncError, match="adapter sync: load_adapter on role rollout rank 0"):
        AdapterTransport(folder=tmp_path / "pair").sync(_Policy(), _Engine(fail=True), 0, 30.0)
