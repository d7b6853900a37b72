"""The ``deepspeed`` backend's record, options and validation through the real plugin manager,
``load_config`` and ``rlweave validate``: ZeRO stage/offload combinations, ``ds_config`` keys
rlweave sets itself, bf16 weights, MoE models and an offload larger than host memory are
refused with their key paths before any worker starts; the built DeepSpeed config merges the
user's other keys."""

from __future__ import annotations

import json

import pytest
from rlweave import cli
from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config
from rlweave.plugins.manager import PluginManager
from rlweave_backend_deepspeed import checks, ds_json
from rlweave_backend_deepspeed.config import DeepSpeedConfig
from typer.testing import CliRunner

TINY = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 128,
        "tie_word_embeddings": True}


@pytest.fixture(autouse=True)
def installed_plugins(monkeypatch):
    for var in ("RLWEAVE_PLUGINS", "RLWEAVE_DISABLE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)


def _write(tmp_path, options=None, dtype="float32", **model_changes):
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({**TINY, **model_changes}))
    cfg = {
        "model": {"path": str(model), "dtype": dtype},
        "resources": {"pools": {"default": {"devices_per_node": 3}}},
        "roles": {"policy": {"backend": "deepspeed", "devices": 2, "parallel": {"dp": 2}, "options": options or {},
                             "optim": {"lr": 1e-4}},
                  "rollout": {"engine": "hf", "devices": 1}},
        "algorithm": {"name": "grpo"},
        "rewards": [{"name": "arith_exact"}],
    }
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    return path


def _errors(path) -> str:
    try:
        load_config(path, pm=PluginManager(), check_inputs=False)
    except ConfigError as exc:
        return str(exc)
    return ""


def test_a_valid_zero3_offload_config_loads(tmp_path):
    assert _errors(_write(tmp_path, {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"})) == ""


def test_parameter_offload_needs_zero3(tmp_path):
    err = _errors(_write(tmp_path, {"zero_stage": 2, "offload_param": "cpu"}))
    assert "roles.policy.options.offload_param" in err and "zero_stage: 3" in err


def test_an_unknown_stage_is_refused_by_the_options_model(tmp_path):
    err = _errors(_write(tmp_path, {"zero_stage": 4}))
    assert "zero_stage" in err


@pytest.mark.parametrize("key,setting", [
    ({"zero_optimization": {"stage": 3}}, "options.zero_stage"),
    ({"bf16": {"enabled": True}}, "options.mixed_precision"),
    ({"gradient_clipping": 1.0}, "optim.grad_clip"),
    ({"optimizer": {"type": "Adam"}}, "optim"),
    ({"train_batch_size": 8}, "max_tokens_per_micro_batch"),
])
def test_ds_config_keys_rlweave_sets_are_refused_naming_the_setting(tmp_path, key, setting):
    err = _errors(_write(tmp_path, {"ds_config": key}))
    path = ".".join([next(iter(key))] + ([next(iter(key[next(iter(key))]))] if isinstance(
        key[next(iter(key))], dict) and next(iter(key)) == "zero_optimization" else []))
    assert f"roles.policy.options.ds_config.{path}" in err and setting in err


def test_other_ds_config_keys_merge_into_the_built_config():
    opts = DeepSpeedConfig(zero_stage=3, offload_optimizer="cpu", mixed_precision="bf16",
                           ds_config={"zero_optimization": {"reduce_bucket_size": 1000}, "communication_data_type": "fp32"})
    cfg = ds_json.build(opts, grad_clip=0.5)
    assert cfg["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": False},
                                        "reduce_bucket_size": 1000}
    assert cfg["communication_data_type"] == "fp32"
    assert cfg["gradient_clipping"] == 0.5 and cfg["bf16"]["enabled"] and cfg["bf16"]["check_grad_overflow"]
    assert cfg["managed_gradient_accumulation"] is False
    with pytest.raises(ValueError, match="options.ds_config.gradient_clipping"):
        ds_json.build(DeepSpeedConfig(ds_config={"gradient_clipping": 1.0}), None)


def test_bf16_weights_and_moe_models_are_refused(tmp_path):
    err = _errors(_write(tmp_path, dtype="bfloat16"))
    assert "model.dtype" in err and "mixed_precision: bf16" in err
    err = _errors(_write(tmp_path, num_experts=4))
    assert "roles.policy.backend" in err and "mixture-of-experts" in err


def test_param_count_matches_the_tiny_model(tmp_path):
    from rlweave.testing.tiny_model import build_tiny_qwen2

    path = build_tiny_qwen2(tmp_path / "tiny", seed=1)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    assert checks.param_count(cfg) == sum(p.numel() for p in model.parameters())


def test_an_offload_larger_than_host_memory_is_refused_before_any_worker(tmp_path, monkeypatch):
    # a 7B-shaped model: the optimizer offload alone needs ~16 bytes per parameter
    big = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32,
           "num_hidden_layers": 32, "vocab_size": 32000, "tie_word_embeddings": False}
    n = checks.param_count({**TINY, **big})
    assert 6.5e9 < n < 7.0e9
    monkeypatch.setattr(checks, "available_host_bytes", lambda: 64 << 30)
    path = _write(tmp_path, {"zero_stage": 3, "offload_optimizer": "cpu"}, **big)
    err = _errors(path)
    assert "roles.policy.options.offload_optimizer" in err and "GiB of host memory" in err
    assert _errors(_write(tmp_path, {"zero_stage": 3}, **big)) == ""  # no offload: nothing on the host


def test_validate_reports_the_error_with_exit_code_2(tmp_path):
    res = CliRunner().invoke(cli.app, ["validate", str(_write(tmp_path, {"zero_stage": 1, "offload_param": "cpu"}))])
    assert res.exit_code == 2
    assert "offload_param" in res.output
