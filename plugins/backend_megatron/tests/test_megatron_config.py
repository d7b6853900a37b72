"""The ``megatron`` backend's record, options and validation checks through the real plugin
manager, ``load_config`` and ``rlweave validate``: a model shape that does not split over the
parallel sizes, an unsupported architecture or MoE model, and sequence parallelism without
tensor parallelism are refused with their numbers and key paths before any worker starts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from rlweave import cli
from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config
from rlweave.plugins.manager import PluginManager
from rlweave_backend_megatron import plugin
from rlweave_backend_megatron.checks import check_role
from rlweave_backend_megatron.config import MegatronConfig

#: a tiny dense Qwen2 shape: only config.json is read by validation
TINY = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 128}


@pytest.fixture(autouse=True)
def installed_plugins(monkeypatch):
    for var in ("RLWEAVE_PLUGINS", "RLWEAVE_DISABLE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)


def _model_dir(root, **changes):
    root.mkdir(parents=True, exist_ok=True)
    data = {k: v for k, v in {**TINY, **changes}.items() if v is not None}
    (root / "config.json").write_text(json.dumps(data))
    return root


def _config(model, parallel, devices, options=None, role_model=False):
    policy = {"backend": "megatron", "devices": devices, "parallel": parallel, "options": options or {}}
    if role_model:
        policy["model"] = {"path": str(model)}
    return {
        "model": {"path": str(model)},
        "resources": {"pools": {"default": {"devices_per_node": 8}}},
        "roles": {"policy": policy, "rollout": {"engine": "hf", "devices": 1}},
        "algorithm": {"name": "grpo"},
        "rewards": [{"name": "arith_exact"}],
    }


def _errors(tmp_path, parallel, devices, options=None, role_model=False, **changes):
    cfg = _config(_model_dir(tmp_path / "m", **changes), parallel, devices, options, role_model)
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    try:
        load_config(path, pm=PluginManager(), check_inputs=False)
    except ConfigError as exc:
        return [str(issue) for issue in exc.issues]
    return []


def _provided(pm):
    return next(p for p in pm.providers("backend") if p.name == "megatron")


def test_record_is_registered_and_available_with_megatron_core_installed():
    pm = PluginManager()
    provided = _provided(pm)
    info, record = provided.plugin, provided.record
    assert (info.entry_point, info.distribution, info.version, info.status) == \
        ("megatron", "rlweave-backend-megatron", "0.1.0", "ok")
    assert (provided.status, provided.error) == ("ok", None)
    assert "megatron" in pm.names("backend")
    assert record.target == "rlweave_backend_megatron.worker:MegatronWorker"
    assert record.config_model is MegatronConfig and record.check is check_role
    assert record.model_types == ("causal_lm", "value", "reward") and record.parallel == ("dp", "tp", "pp", "ep")
    assert record.kernels == ("moe_groupgemm",)
    assert importlib.util.find_spec("megatron.core") is not None and plugin.probe() is None


def test_without_megatron_core_the_backend_is_unavailable_with_the_install_command(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "megatron" else real(name, *a))
    pm = PluginManager()
    provided = _provided(pm)
    assert provided.status == "unavailable" and "megatron" not in pm.names("backend")
    assert "pip install 'rlweave-backend-megatron[megatron]'" in provided.error and "megatron-core==0.16.1" in provided.error
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(_config(_model_dir(tmp_path / "m"), {"tp": 2}, 2)))
    with pytest.raises(ConfigError) as err:
        load_config(path, pm=pm, check_inputs=False)
    assert "roles.policy.backend: training backend 'megatron' (rlweave-backend-megatron 0.1.0) is unavailable here: " \
           "megatron-core is not installed" in str(err.value)


def test_probe_options_and_checks_stay_light(tmp_path):
    code = ("import sys, json; from types import SimpleNamespace as S\n"
            "from rlweave_backend_megatron import plugin, checks, config\n"
            "probe = plugin.probe(); config.MegatronConfig(pipeline_schedule='sequential')\n"
            f"errs = checks.check_role('policy', S(parallel={{'tp': 3}}, options={{}}, model=None), S(path={str(_model_dir(tmp_path / 'm'))!r}))\n"
            "print(json.dumps([probe, len(errs), sorted(m for m in ('torch', 'megatron', 'ray', 'transformers') if m in sys.modules)]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [None, 3, []]  # heads 4, kv heads 2, intermediate 64 over tp 3


def test_valid_configs_pass_and_show_every_option(tmp_path):
    cfg = _config(_model_dir(tmp_path / "m"), {"tp": 2, "pp": 2}, 4)
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    run, resolved = load_config(path, pm=PluginManager(), check_inputs=False)
    assert resolved.roles["policy"].name == "megatron"
    assert resolved.role_options["policy"] == MegatronConfig()
    assert run.roles["policy"].options == {
        "transformer_impl": "auto", "sequence_parallel": False, "use_packing": True, "max_tokens_per_micro_batch": 4096,
        "max_tokens_per_forward": None, "pipeline_schedule": "1f1b", "master_weights": True, "shard_optimizer": True,
        "dp_bucket_bytes": 50_000_000, "moe_aux_loss_coef": None,
        "activation_checkpointing": False, "seed": None,
        "hf_shard_bytes": 2_000_000_000, "make_vocab_size_divisible_by": 128}
    assert _errors(tmp_path, {"dp": 2, "tp": 2}, 4) == []
    assert _errors(tmp_path, {"tp": 2}, 4) == []  # dp 2 from the devices
    assert _errors(tmp_path, {"pp": 2}, 2, model_type="llama") == []
    assert _errors(tmp_path, {"tp": 2}, 2, model_type="qwen3", head_dim=24) == []
    assert _errors(tmp_path, {"tp": 2}, 2, num_key_value_heads=None) == []  # kv heads default to the heads


def test_heads_not_divisible_by_tp(tmp_path):
    errs = _errors(tmp_path, {"tp": 4}, 4, num_attention_heads=6, num_key_value_heads=6)
    assert len(errs) == 2, errs
    assert all("c.yaml: roles.policy.parallel.tp: role 'policy': " in e and str(tmp_path / "m") in e
               for e in errs)
    assert "6 attention heads are not divisible by parallel.tp=4" in errs[0]
    assert "6 key/value heads are not divisible by parallel.tp=4" in errs[1]


def test_kv_heads_not_divisible_by_tp(tmp_path):
    errs = _errors(tmp_path, {"tp": 4}, 4, num_attention_heads=8, num_key_value_heads=2)
    assert len(errs) == 1 and "roles.policy.parallel.tp" in errs[0]
    assert "2 key/value heads are not divisible by parallel.tp=4" in errs[0]


def test_intermediate_size_not_divisible_by_tp(tmp_path):
    errs = _errors(tmp_path, {"tp": 4}, 4, num_attention_heads=8, num_key_value_heads=4, intermediate_size=66)
    assert len(errs) == 1 and "roles.policy.parallel.tp" in errs[0]
    assert "intermediate_size 66 is not divisible by parallel.tp=4" in errs[0]


def test_layers_not_divisible_by_pp(tmp_path):
    errs = _errors(tmp_path, {"dp": 1, "pp": 2}, 2, num_hidden_layers=3)
    assert len(errs) == 1 and "c.yaml: roles.policy.parallel.pp: " in errs[0]
    assert "3 layers (num_hidden_layers) are not divisible by parallel.pp=2" in errs[0]


def test_moe_layers_of_dense_architectures_are_refused(tmp_path):
    errs = _errors(tmp_path, {"tp": 2}, 2, num_experts=8)
    assert len(errs) == 1 and ("c.yaml: model.path: role 'policy': mixture-of-experts layers in a qwen2 model "
                               "(8 experts, config.json num_experts)") in errs[0]
    assert "use backend 'fsdp'" in errs[0]
    nested = {"text_config": {**TINY, "num_local_experts": 4}}  # a role's own model, experts in text_config
    errs = _errors(tmp_path, {"tp": 2}, 2, role_model=True, **nested)
    assert len(errs) == 1 and "c.yaml: roles.policy.model.path: " in errs[0] and "(4 experts, config.json num_local_experts)" in errs[0]


QWEN3_MOE = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_local_experts": 8,
             "num_experts_per_tok": 2, "moe_intermediate_size": 16, "decoder_sparse_step": 1, "mlp_only_layers": []}


def test_qwen3_moe_expert_parallel_sizes(tmp_path):
    assert _errors(tmp_path, {"ep": 2}, 2, **QWEN3_MOE) == []  # dp 2 from the devices, split into 2 expert groups
    assert _errors(tmp_path, {"dp": 4, "ep": 2}, 4, **QWEN3_MOE) == []
    assert _errors(tmp_path, {"tp": 2, "ep": 2}, 4, **QWEN3_MOE) == []
    errs = _errors(tmp_path, {"dp": 2, "ep": 4}, 2, **QWEN3_MOE)  # ep takes no devices: it must divide dp
    assert any("roles.policy.parallel.ep: role 'policy': ep=4 must divide the data-parallel size 2" in e for e in errs), errs
    errs = _errors(tmp_path, {"dp": 3, "ep": 3}, 3, **QWEN3_MOE)
    assert errs == [f"{tmp_path / 'c.yaml'}: roles.policy.parallel.ep: role 'policy': 8 experts (config.json "
                    f"num_experts) are not divisible by parallel.ep=3 (model {tmp_path / 'm'})"]
    errs = _errors(tmp_path, {"ep": 2}, 2)
    assert len(errs) == 1 and "parallel.ep=2 splits the experts of a mixture-of-experts model; this model is dense" in errs[0]


def test_qwen3_moe_refuses_pipeline_stages_sequence_parallelism_and_dense_layers(tmp_path):
    errs = _errors(tmp_path, {"pp": 2}, 2, **QWEN3_MOE)
    assert len(errs) == 1 and "roles.policy.parallel.pp: " in errs[0] and "without pipeline stages" in errs[0]
    errs = _errors(tmp_path, {"tp": 2}, 2, {"sequence_parallel": True}, **QWEN3_MOE)
    assert len(errs) == 1 and "roles.policy.options.sequence_parallel: " in errs[0] and "mixture-of-experts" in errs[0]
    errs = _errors(tmp_path, {"tp": 2}, 2, **{**QWEN3_MOE, "mlp_only_layers": [1]})
    assert len(errs) == 1 and "model.path: " in errs[0] and "mlp_only_layers" in errs[0]


def test_qwen3_moe_takes_router_replay(tmp_path):
    """The record says ``router_replay``, so ``algorithm.router_replay`` r2 and r3 pass validation."""
    assert plugin.rlweave_training_backends()[0].router_replay
    for mode in ("r2", "r3"):
        cfg = _config(_model_dir(tmp_path / "m", **QWEN3_MOE), {"ep": 2}, 2)
        cfg["algorithm"]["router_replay"] = mode
        path = tmp_path / "c.yaml"
        path.write_text(json.dumps(cfg))
        _, resolved = load_config(path, pm=PluginManager(), check_inputs=False)
        assert resolved.algorithm_config.router_replay == mode


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    errs = _errors(tmp_path, {"tp": 2}, 2, model_type="gemma2")
    assert len(errs) == 1 and "c.yaml: model.path: " in errs[0]
    assert "architecture 'gemma2' (config.json model_type) is not supported by the megatron backend; " \
           "supported: qwen2, qwen3, llama" in errs[0]


def test_sequence_parallel_needs_tensor_parallel_ranks(tmp_path):
    assert _errors(tmp_path, {"tp": 2}, 2, {"sequence_parallel": True}) == []
    errs = _errors(tmp_path, {"dp": 2}, 2, {"sequence_parallel": True})
    assert len(errs) == 1 and "c.yaml: roles.policy.options.sequence_parallel: " in errs[0]
    assert "it needs parallel.tp > 1 (got tp=1)" in errs[0]


@pytest.mark.parametrize("change,words", [
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "rotary scaling 'llama3' (config.json rope_parameters) is not supported"),
    ({"use_sliding_window": True}, "sliding-window attention"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"model_type": "qwen3", "attention_bias": True}, "qwen3 with attention_bias or mlp_bias is not supported"),
])
def test_architecture_settings_the_backend_cannot_convert_are_refused(tmp_path, change, words):
    errs = _errors(tmp_path, {"tp": 2}, 2, **change)
    assert len(errs) == 1 and "c.yaml: model.path: role 'policy': " in errs[0] and words in errs[0]


def test_core_checks_the_product_of_the_sizes_against_devices(tmp_path):
    errs = _errors(tmp_path, {"dp": 1, "tp": 2, "pp": 2}, 2)
    assert len(errs) == 1 and "roles.policy.parallel: role 'policy': dp 1 * tp 2 * pp 2 = 4, but " \
                              "roles.policy.devices is 2" in errs[0]


def test_unknown_and_invalid_options_are_refused(tmp_path):
    errs = _errors(tmp_path, {"tp": 2}, 2, {"transformer_impl": "te", "micro_batch_size": 2, "pipeline_schedule": "zb"})
    assert any("roles.policy.options.transformer_impl" in e for e in errs), errs
    assert any("roles.policy.options.pipeline_schedule" in e and "'zb'" in e and "1f1b" in e for e in errs), errs
    assert any("roles.policy.options.micro_batch_size" in e for e in errs), errs


def test_rlweave_validate_names_the_numbers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    good = _config(_model_dir(tmp_path / "m"), {"tp": 2, "pp": 2}, 4)
    (tmp_path / "c.yaml").write_text(json.dumps(good))
    runner = CliRunner()
    ok = runner.invoke(cli.app, ["validate", "c.yaml", "--schema-only"])
    assert ok.exit_code == 0, ok.output
    assert "role policy: backend megatron, pool default, devices 4" in ok.output
    bad = runner.invoke(cli.app, ["validate", "c.yaml", "--schema-only", "roles.policy.parallel.tp=4",
                                  "roles.policy.parallel.pp=1"])
    assert bad.exit_code == 2
    assert "c.yaml: roles.policy.parallel.tp: role 'policy': 2 key/value heads are not divisible by " \
           "parallel.tp=4" in bad.output
