"""``roles.<role>.lora`` and ``algorithm.reference`` in validation (installed plugins, no workers)."""

from __future__ import annotations

import json

import pytest
from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config

LORA = {"r": 8, "alpha": 16}


def _config(tmp_path, **changes):
    base = {
        "model": {"path": "m", "dtype": "float32"},
        "resources": {"pools": {"default": {"devices_per_node": 3}}},
        "roles": {"policy": {"backend": "fsdp", "optim": {"lr": 1e-4}, "lora": LORA},
                  "rollout": {"engine": "hf"}},
        "algorithm": {"name": "grpo", "kl": {"beta": 0.1}},
        "rewards": [{"name": "arith_exact"}],
    }
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            for k, v in value.items():
                base[key][k] = v
        else:
            base[key] = value
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(base))
    return path


def _errors(path) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, check_inputs=False)
    return str(err.value)


def test_kl_run_with_lora_starts_no_reference_role(tmp_path):
    cfg, resolved = load_config(_config(tmp_path), check_inputs=False)
    assert "reference" not in resolved.role_names and resolved.views == {"reference": "policy"}
    assert cfg.roles["policy"].lora.r == 8


def test_reference_role_when_asked_or_not_the_base_model(tmp_path):
    path = _config(tmp_path, algorithm={"reference": "role"})
    assert "roles.reference: missing" in _errors(path)
    ref = {"backend": "fsdp", "model": {"path": "other"}}
    _, resolved = load_config(_config(tmp_path, roles={"reference": ref}), check_inputs=False)
    assert "reference" in resolved.role_names and not resolved.views
    msg = _errors(_config(tmp_path, roles={"reference": ref}, algorithm={"reference": "adapter_disabled"}))
    assert "algorithm.reference: 'adapter_disabled' needs" in msg and "path ('other')" in msg


def test_same_base_reference_role_is_not_started_with_a_warning(tmp_path):
    _, resolved = load_config(_config(tmp_path, roles={"reference": {"backend": "fsdp"}}), check_inputs=False)
    assert resolved.views == {"reference": "policy"}
    assert any("roles.reference: not started" in w for w in resolved.warnings)


@pytest.mark.parametrize("lora, key", [({"r": 0}, "roles.policy.lora.r"),
                                       ({"target_modules": "q_proj"}, "roles.policy.lora.target_modules"),
                                       ({"rank": 4}, "roles.policy.lora.rank")])
def test_bad_lora_values_name_the_key(tmp_path, lora, key):
    assert key in _errors(_config(tmp_path, roles={"policy": {"backend": "fsdp", "optim": {}, "lora": lora}}))


def test_lora_where_it_cannot_train(tmp_path):
    msg = _errors(_config(tmp_path, roles={"policy": {"backend": "megatron", "optim": {}, "lora": LORA}}))
    assert "roles.policy.lora: backend 'megatron' of role 'policy' does not train LoRA adapters" in msg
    msg = _errors(_config(tmp_path, roles={"reference": {"backend": "fsdp", "lora": LORA}},
                          algorithm={"reference": "role"}))
    assert "roles.reference.lora: the reference role never trains" in msg
    msg = _errors(_config(tmp_path, roles={"policy": {"backend": "fsdp", "lora": LORA}}))
    assert "roles.policy.lora: role 'policy' has no optimizer" in msg


def test_unknown_target_module_lists_the_linear_layers(tmp_path):
    from rlweave.interfaces.lora import LoRASection
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave_backend_fsdp.lora import apply_lora
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny_qwen2(tmp_path / "m", seed=1))
    with pytest.raises(ValueError) as err:
        apply_lora(model, LoRASection(target_modules=["q_proj", "qkv"]), "causal_lm", "policy")
    msg = str(err.value)
    assert "roles.policy.lora.target_modules: no linear layer named 'qkv'" in msg
    assert "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj" in msg


def test_mixture_of_experts_adapters_leave_routers_and_stacked_experts(tmp_path):
    from rlweave.interfaces.lora import LoRASection
    from rlweave.testing.tiny_model import build_tiny_qwen2_moe
    from rlweave_backend_fsdp.lora import apply_lora
    from transformers import AutoModelForCausalLM

    path = build_tiny_qwen2_moe(tmp_path / "moe", vocab_size=128, hidden=64, layers=1, heads=2, kv_heads=1,
                                moe_ffn=32, num_experts=4, top_k=2, seed=3)
    model = apply_lora(AutoModelForCausalLM.from_pretrained(path), LoRASection(), "causal_lm", "policy")
    adapted = {n.split(".lora_")[0] for n, p in model.named_parameters() if p.requires_grad}
    assert {n.rsplit(".", 1)[-1] for n in adapted} == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                       "up_proj", "down_proj"}
    assert all(".shared_expert." in n for n in adapted if n.endswith(("gate_proj", "up_proj", "down_proj")))


def test_adapter_sync_needs_lora_and_an_engine_that_serves_adapters(tmp_path):
    from types import SimpleNamespace

    from rlweave.config.lora import adapter_sync_problems

    cfg, _ = load_config(_config(tmp_path, weight_sync={"lora": "adapter"}), check_inputs=False)
    plain = SimpleNamespace(name="plain", lora=False)
    want = ("'adapter' needs a rollout engine that serves LoRA adapters; engine 'plain' does not (use vllm or hf, "
            "or weight_sync.lora: merged)")
    assert adapter_sync_problems(cfg, {"rollout": plain}) == [("weight_sync.lora", want)]
    msg = _errors(_config(tmp_path, weight_sync={"lora": "adapter"},
                          roles={"policy": {"backend": "fsdp", "optim": {}}, "rollout": {"engine": "vllm"}}))
    assert "roles.policy.lora is not set" in msg
    cfg, _ = load_config(_config(tmp_path, weight_sync={"lora": "adapter"}, roles={"rollout": {"engine": "vllm"}}),
                         check_inputs=False)
    from rlweave.scheduler.contexts import worker_context

    assert worker_context(cfg, "rollout", 0, ("127.0.0.1", 1)).lora.r == 8, "the engine learns the adapter rank"
