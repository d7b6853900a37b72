"""FSDP checkpoints load without running pickles (one rank, gloo, in this process).

The per-rank extra state is JSON + safetensors and round-trips step, LR schedule and every
RNG stream; a pickle planted where the loader reads (legacy ``extra_rank0.pt``, the JSON or
safetensors file, DCP's ``.metadata``, a DCP non-tensor item) is refused with an error naming
it, and the code in it never runs, although the stock loaders would run it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from rlweave.backend_helpers import safe_dcp
from rlweave.backend_helpers.schedule import WarmupSchedule
from rlweave.runner.checkpoint import CheckpointError
from rlweave.testing.helper_modules import import_helper
from rlweave.testing.tamper import malicious_pickle
from rlweave_backend_fsdp import checkpoint

_tamper = import_helper(Path(__file__).with_name("dcp_tamper.py"))
byte_items, plant_byte_item = _tamper.byte_items, _tamper.plant_byte_item


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _build(seed=0):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, WarmupSchedule(2, "cosine", 10, 0.1))
    return model, opt, sched


def _train(model, opt, sched, steps=3):
    for _ in range(steps):
        model(torch.randn(5, 8)).pow(2).mean().backward()
        opt.step(), sched.step(), opt.zero_grad()


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(4).tolist()


def _saved(tmp_path, name="ckpt"):
    model, opt, sched = _build()
    _train(model, opt, sched)
    path = tmp_path / name
    checkpoint.save(str(path), model, opt, {"step": 3, "scheduler": sched.state_dict()}, 0)
    return path, model, opt, sched


def test_extra_state_is_json_and_safetensors_and_round_trips(tmp_path):
    """Nothing but DCP files, JSON and safetensors; loading restores weights, AdamW state, LR
    schedule, step and every RNG stream (the next steps equal the uninterrupted ones)."""
    from safetensors.torch import load_file

    path, model, opt, sched = _saved(tmp_path)
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.distcp", "extra_rank0.json", "extra_rank0.safetensors"]
    extra = json.loads((path / "extra_rank0.json").read_text())
    assert extra["step"] == 3 and extra["scheduler"]["last_epoch"] == 3 and extra["format"] == 1
    assert set(load_file(str(path / "extra_rank0.safetensors"))) == {"torch"}
    expected = _draws()
    _train(model, opt, sched, 2)
    after = [p.full_tensor().clone() for p in model.parameters()]
    m2, o2, s2 = _build(seed=1)
    extra = checkpoint.load(str(path), m2, o2, 0)
    assert _draws() == expected
    s2.load_state_dict(extra["scheduler"])
    assert extra["step"] == 3 and s2.last_epoch == 3
    _train(m2, o2, s2, 2)
    assert all(torch.equal(a, p.full_tensor()) for a, p in zip(after, m2.parameters()))
    assert s2.get_last_lr() == sched.get_last_lr()


def test_a_checkpoint_before_the_first_step_changes_nothing(tmp_path):
    """Saving a never-stepped optimizer (what a run with ``run.max_restarts`` does at step 0) must
    not step it: torch's ``get_state_dict`` would give AdamW a step count of 1 and change every
    later update. Loading that checkpoint into an optimizer that trained since (a worker kept
    alive through a recovery) gives back a never-stepped one: the next steps are bitwise those
    of a run that never saved."""
    path = tmp_path / "step0"
    model, opt, sched = _build()
    torch.manual_seed(7)
    checkpoint.save(str(path), model, opt, {"step": 0, "scheduler": sched.state_dict()}, 0)
    assert not opt.state, "saving stepped the optimizer"
    assert json.loads((path / "extra_rank0.json").read_text())["optimizer_state"] is False
    torch.manual_seed(7)
    _train(model, opt, sched)
    saved_run = [p.full_tensor().clone() for p in model.parameters()]

    plain, plain_opt, plain_sched = _build()
    torch.manual_seed(7)
    _train(plain, plain_opt, plain_sched)
    assert all(torch.equal(a, p.full_tensor()) for a, p in zip(saved_run, plain.parameters()))

    extra = checkpoint.load(str(path), model, opt, 0)  # the live, trained optimizer goes back to step 0
    assert not opt.state and "optimizer_state" not in extra
    sched.load_state_dict(extra["scheduler"])
    for group, lr in zip(opt.param_groups, sched.get_last_lr()):
        group["lr"] = lr
    torch.manual_seed(7)
    _train(model, opt, sched)
    assert all(torch.equal(a, p.full_tensor()) for a, p in zip(saved_run, model.parameters()))


def _refused(path, trap, words):
    m2, o2, _ = _build(seed=1)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(str(path), m2, o2, 0)
    assert not trap.exists(), "the planted pickle ran"
    for w in words:
        assert w in str(info.value), str(info.value)


def test_legacy_pickled_extra_state_is_refused(tmp_path):
    path, *_ = _saved(tmp_path)
    trap = tmp_path / "code-ran"
    (path / "extra_rank0.json").unlink()
    (path / "extra_rank0.pt").write_bytes(malicious_pickle(trap, torch_format=True))
    _refused(path, trap, ["extra_rank0.pt", "as a pickle", "never loaded"])


@pytest.mark.parametrize("name, words", [
    ("extra_rank0.json", ["extra_rank0.json", "is a pickle"]),
    ("extra_rank0.safetensors", ["extra_rank0.safetensors", "not a safetensors file"]),
])
def test_pickle_in_place_of_extra_state_is_refused(tmp_path, name, words):
    path, *_ = _saved(tmp_path)
    trap = tmp_path / "code-ran"
    (path / name).write_bytes(malicious_pickle(trap, torch_format=name.endswith("safetensors")))
    _refused(path, trap, words)


def test_malicious_dcp_metadata_is_refused(tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    path, *_ = _saved(tmp_path)
    (path / ".metadata").write_bytes(malicious_pickle(tmp_path / "stock-ran"))
    with contextlib.suppress(Exception):  # the stock reader runs it (the trap is live); its result is no Metadata
        FileSystemReader(str(path)).read_metadata()
    assert (tmp_path / "stock-ran").exists()
    trap = tmp_path / "code-ran"
    (path / ".metadata").write_bytes(malicious_pickle(trap))
    _refused(path, trap, [".metadata", "posix.system", "refusing to unpickle"])


def test_malicious_dcp_byte_item_is_refused(tmp_path):
    path, *_ = _saved(tmp_path)
    assert "optim.param_groups.0.lr" in byte_items(path)
    payload = malicious_pickle(tmp_path / "stock-ran", torch_format=True)
    with contextlib.suppress(Exception):  # what DefaultLoadPlanner.load_bytes does with it
        torch.load(io.BytesIO(payload), weights_only=False)
    assert (tmp_path / "stock-ran").exists()
    trap = tmp_path / "code-ran"
    plant_byte_item(path, "optim.param_groups.0.lr", malicious_pickle(trap, torch_format=True))
    _refused(path, trap, ["optim.param_groups.0.lr", "posix.system", "refusing to unpickle"])


def test_metadata_pointing_outside_the_checkpoint_is_refused(tmp_path):
    import dataclasses
    import pickle

    path, *_ = _saved(tmp_path)
    md = safe_dcp.read_metadata(path)
    key = next(iter(md.storage_data))
    md.storage_data[key] = dataclasses.replace(md.storage_data[key], relative_path="../elsewhere.distcp")
    (path / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(CheckpointError, match="not a file of the checkpoint directory"):
        safe_dcp.read_metadata(path)
