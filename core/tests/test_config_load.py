"""Loading valid configs: overrides, plugin sections with defaults, run directory files."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import yaml

from rlweave.config.loader import load_config
from rlweave.config.overrides import parse_override
from rlweave.config.rundir import write_run_dir

_spec = importlib.util.spec_from_file_location("rlweave_test_fakes", Path(__file__).parent / "plugin_dists" / "fakes.py")
fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)

BASE = {
    "run": {"total_steps": 2},
    "algorithm": {"name": "grpo", "group_size": 8},
    "roles": {"policy": {"backend": "fsdp", "options": {"grad_accum": 2}}, "rollout": {"engine": "vllm"}},
    "rewards": [{"name": "arith_exact"}, {"name": "format", "weight": 0.5}],
}


@pytest.fixture(autouse=True)
def no_placement(monkeypatch):
    """Placement is helper B's check; here it always passes (its own tests cover it)."""
    fake = types.ModuleType("rlweave.config.placement")
    fake.check_placement = lambda cfg, roles, supported=None, rank_spans=None: []
    fake.spans_of = lambda record: ()
    monkeypatch.setitem(sys.modules, "rlweave.config.placement", fake)


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_valid_config_resolves_plugins_and_fills_plugin_defaults(tmp_path):
    cfg, resolved = load_config(write(tmp_path, BASE), pm=fakes.make_pm())
    assert resolved.algorithm.name == "grpo" and resolved.role_names == ("policy", "rollout")
    assert {r: rec.name for r, rec in resolved.roles.items()} == {"policy": "fsdp", "rollout": "vllm"}
    assert cfg.roles["policy"].options == {"grad_accum": 2, "reshard": True}
    assert cfg.roles["rollout"].options == {"gpu_memory_utilization": 0.15}
    assert cfg.algorithm.model_extra == {"group_size": 8, "kl_beta": 0.0}
    assert cfg.rewards[1].args == {"pattern": r"Answer: \d+"}
    assert [r.name if r else None for r in resolved.rewards] == ["arith_exact", "format"]
    assert resolved.warnings == []


def test_overrides_set_nested_keys_list_items_and_change_the_roles_needed(tmp_path):
    cfg, resolved = load_config(write(tmp_path, {**BASE, "roles": {**BASE["roles"], "reference": {"backend": "fsdp"}}}),
                                ["run.total_steps=7", "rewards.1.weight=2", "algorithm.kl_beta=0.1",
                                 "roles.rollout.options.gpu_memory_utilization=0.5", "run.name='042'",
                                 "data.train=data/train.jsonl"], pm=fakes.make_pm(), check_inputs=False)
    assert cfg.run.total_steps == 7 and cfg.rewards[1].weight == 2.0 and cfg.run.name == "042"
    assert cfg.roles["rollout"].options["gpu_memory_utilization"] == 0.5
    assert cfg.data.train == "data/train.jsonl"
    assert resolved.role_names == ("policy", "rollout", "reference")


def test_role_not_needed_by_the_algorithm_is_a_warning(tmp_path):
    data = {**BASE, "roles": {**BASE["roles"], "critic": {"backend": "fsdp"}}}
    _, resolved = load_config(write(tmp_path, data), pm=fakes.make_pm())
    assert resolved.warnings == ["roles.critic: role 'critic' is not used by algorithm 'grpo'"]


def test_an_optimizer_on_a_role_that_never_trains_is_a_warning(tmp_path):
    roles = {**BASE["roles"], "rollout": {"engine": "vllm", "optim": {"lr": 1e-4}},
             "reference": {"backend": "fsdp", "optim": {"lr": 1e-4}}}
    _, resolved = load_config(write(tmp_path, {**BASE, "roles": roles}), ["algorithm.kl_beta=0.1"], pm=fakes.make_pm(),
                              check_inputs=False)
    assert sorted(w.split(":")[0] for w in resolved.warnings) == ["roles.reference.optim", "roles.rollout.optim"]
    assert all("never trains" in w for w in resolved.warnings)


@pytest.mark.parametrize("text,expected", [
    ("a.b=3", (["a", "b"], 3)), ("a=true", (["a"], True)), ("a=[1, 2]", (["a"], [1, 2])),
    ("a=", (["a"], None)), ("a='3'", (["a"], "3")), ("x.0.y=a=b", (["x", "0", "y"], "a=b")),
])
def test_override_values_are_yaml(text, expected):
    assert parse_override(text) == expected


def test_run_dir_gets_resolved_config_and_plugin_versions(tmp_path):
    pm = fakes.make_pm()
    cfg, resolved = load_config(write(tmp_path, BASE), ["run.seed=5"], pm=pm)
    run_dir = write_run_dir(tmp_path / "runs" / "r1", cfg, pm, resolved)
    again = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())
    assert again["run"]["seed"] == 5 and again["roles"]["policy"]["options"] == {"grad_accum": 2, "reshard": True}
    cfg2, _ = load_config(run_dir / "config.resolved.yaml", pm=pm)
    assert cfg2 == cfg
    report = json.loads((run_dir / "plugins.json").read_text())
    assert report["rlweave"] == "0.1.0" and report["plugin_api_version"] == 1
    fsdp = next(p for p in report["plugins"] if p["entry_point"] == "fsdp")
    assert fsdp == {"entry_point": "fsdp", "distribution": "rlweave-backend-fsdp", "version": "0.1.0",
                    "status": "ok", "error": None, "records": [{"kind": "backend", "name": "fsdp"}]}
    assert report["selected"] == {"algorithm": "grpo", "roles": {"policy": {"kind": "backend", "name": "fsdp"},
                                                                 "rollout": {"kind": "engine", "name": "vllm"}},
                                  "rewards": ["arith_exact", "format"], "kernels": [], "run_mode": "sync",
                                  "rollout": None}  # the fake algorithm samples through no rollout
