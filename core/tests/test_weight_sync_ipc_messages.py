"""The cuda_ipc channel's messages are JSON (bucket meta + memory handle), never pickles: a CPU
and a CUDA-shaped handle survive the round trip, anything else is refused without running code."""

from __future__ import annotations

import ast
import inspect
import json

import pytest
import torch

from rlweave.weight_sync import cuda_ipc
from rlweave.weight_sync.buckets import BucketMeta
from rlweave.weight_sync.cuda_ipc import decode_message, encode_message
from rlweave.weight_sync.interface import WeightSyncError

META = BucketMeta(3, ("a.weight", "b"), ((2, 3), ()), ("float32", "bfloat16"), (0, 32), 34, "00ff")


def test_cpu_handle_round_trip():
    handle = ("cpu", 1234, 17, 4096, 16, 34)
    meta, back = decode_message(encode_message(META, handle))
    assert meta == META and back == handle


def test_cuda_handle_round_trip():
    args = (torch.Tensor, torch.Size([64]), (1,), 0, torch.storage.TypedStorage, torch.uint8, 0, b"\x00ipc\xff",
            64, 512, False, b"ref", 8, b"\x01event", True)
    meta, (kind, uuid, back) = decode_message(encode_message(META, ("cuda", "GPU-1", args)))
    assert (kind, uuid, meta) == ("cuda", "GPU-1", META)
    assert back == args and back[4] is torch.storage.TypedStorage and back[5] is torch.uint8


@pytest.mark.parametrize("change", [{"tensor_cls": "os.system"}, {"storage_cls": "builtins.eval"},
                                    {"dtype": "float32"}, {"kind": "pickle"}])
def test_foreign_handles_are_refused(change):
    args = (torch.Tensor, torch.Size([8]), (1,), 0, torch.storage.TypedStorage, torch.uint8, 0, b"h", 8, 0, False,
            b"r", 0, b"e", False)
    data = json.loads(encode_message(META, ("cuda", "GPU-1", args)))
    data["handle"].update(change)
    with pytest.raises(WeightSyncError):
        decode_message(json.dumps(data).encode())


def test_malformed_or_pickled_messages_are_refused():
    import pickle

    for msg in (b"not json", json.dumps({"meta": {}}).encode(), pickle.dumps((META, ("cpu", 1, 2, 3, 4, 5)))):
        with pytest.raises(WeightSyncError, match="malformed"):
            decode_message(msg)


def test_the_channel_module_imports_no_pickle():
    tree = ast.parse(inspect.getsource(cuda_ipc))
    names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "pickle" not in names | mods
