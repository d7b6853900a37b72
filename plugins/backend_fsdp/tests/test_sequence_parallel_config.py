"""Validation of ``parallel.sp`` with the installed plugins (``rlweave validate``'s checks):
heads that do not split, sp not dividing the devices, sp on a plugin without it, and options
sequence parallelism cannot run with, each named with its numbers before any worker starts.
Also the row layout (padding, slices) and the attention plan of a padded row."""

from __future__ import annotations

import json

import pytest
import torch

from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config
from rlweave.plugins.manager import PluginManager
from rlweave.backend_helpers.hf_model import attention
from rlweave_backend_fsdp import sequence_parallel
from rlweave_backend_fsdp.checks import kv_repeat


def _model_dir(root, heads: int, kv: int):
    """A directory with only a config.json: all validation reads of a model's shape."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_attention_heads": heads,
                                                  "num_key_value_heads": kv, "hidden_size": 64}))
    return root


def _errors(tmp_path, heads: int, kv: int, sp: int, devices: int, policy_options=None, rollout_parallel=None):
    model = _model_dir(tmp_path / f"m{heads}-{kv}", heads, kv)
    cfg = {
        "model": {"path": str(model)},
        "resources": {"pools": {"default": {"devices_per_node": 8}}},
        "roles": {"policy": {"backend": "fsdp", "devices": devices, "parallel": {"sp": sp},
                             "options": policy_options or {}},
                  "rollout": {"engine": "hf", "devices": 1, "parallel": rollout_parallel or {}}},
        "algorithm": {"name": "grpo"},
        "rewards": [{"name": "arith_exact"}],
    }
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    try:
        load_config(path, pm=PluginManager(), check_inputs=False)
    except ConfigError as exc:
        return [str(issue) for issue in exc.issues]
    return []


def test_valid_sp_configs_pass(tmp_path):
    assert _errors(tmp_path, heads=4, kv=2, sp=2, devices=2) == []
    assert _errors(tmp_path, heads=4, kv=1, sp=2, devices=4) == []  # kv heads repeated; dp 2 x sp 2


def test_heads_not_divisible_by_sp(tmp_path):
    errs = _errors(tmp_path, heads=6, kv=2, sp=4, devices=4)
    assert len(errs) == 1 and "roles.policy.parallel.sp" in errs[0]
    assert "6 attention heads are not divisible by parallel.sp=4" in errs[0]


def test_kv_heads_that_cannot_be_split(tmp_path):
    errs = _errors(tmp_path, heads=6, kv=3, sp=2, devices=2)
    assert len(errs) == 1 and "3 key/value heads cannot be split over parallel.sp=2" in errs[0]


def test_sp_not_dividing_devices(tmp_path):
    errs = _errors(tmp_path, heads=4, kv=2, sp=2, devices=3)
    assert len(errs) == 1 and "roles.policy.parallel" in errs[0] and "sp 2" in errs[0] and "(3)" in errs[0]


def test_sp_on_a_plugin_without_it(tmp_path):
    errs = _errors(tmp_path, heads=4, kv=2, sp=2, devices=2, rollout_parallel={"sp": 2})
    assert any("roles.rollout.parallel.sp" in e and "does not support 'sp'" in e for e in errs), errs


def test_sp_needs_packing_and_varlen_attention(tmp_path):
    errs = _errors(tmp_path, heads=4, kv=2, sp=2, devices=2,
                   policy_options={"use_packing": False, "attn_implementation": "sdpa"})
    assert len(errs) == 2
    assert "roles.policy.options.use_packing" in errs[0] and "packed rows" in errs[0]
    assert "roles.policy.options.attn_implementation" in errs[1] and "not sdpa" in errs[1]


def test_kv_repeat():
    assert kv_repeat(4, 2, 2) == 1 and kv_repeat(4, 1, 2) == 2 and kv_repeat(8, 2, 8) == 4
    with pytest.raises(ValueError, match="4 attention heads are not divisible by parallel.sp=3"):
        kv_repeat(4, 2, 3)


def test_shard_pads_the_row_and_slices_it():
    ids, pos = torch.arange(10, 17), torch.tensor([0, 1, 2, 0, 1, 2, 3])
    parts = [sequence_parallel.shard(ids, pos, sequence_parallel.SPGroup(2, r, None)) for r in range(2)]
    assert [p.pad for p in parts] == [1, 1] and [p.n for p in parts] == [4, 4] and [p.lo for p in parts] == [0, 4]
    assert torch.equal(torch.cat([p.input_ids for p in parts]), torch.tensor([10, 11, 12, 13, 14, 15, 16, 0]))
    assert torch.equal(torch.cat([p.position_ids for p in parts]), torch.tensor([0, 1, 2, 0, 1, 2, 3, 0]))


def test_padded_plan_attends_the_padding_on_its_own():
    """A padded row's plan gives the real tokens exactly the unpadded attention."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(3))
    plain = attention.packed_plan((0, 3, 7))
    padded = attention.padded_plan(plain, 7, 1)
    ref = attention.planned_sdpa(q[:, :, :7], k[:, :, :7], v[:, :, :7], plain, None, 0.0, False)
    got = attention.planned_sdpa(q, k, v, padded, None, 0.0, False)
    assert got.shape == (1, 8, 2, 4) and torch.allclose(got[:, :7], ref, atol=1e-6)
