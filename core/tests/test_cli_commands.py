"""The CLI commands in-process (typer's runner), over in-process test plugins."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlweave import cli

_spec = importlib.util.spec_from_file_location("rlweave_test_fakes", Path(__file__).parent / "plugin_dists" / "fakes.py")
fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)

CONFIG = {"run": {"name": "demo", "output_dir": "runs"}, "algorithm": {"name": "grpo"},
          "roles": {"policy": {"backend": "fsdp"}, "rollout": {"engine": "vllm"}},
          "rewards": [{"name": "arith_exact"}]}
runner = CliRunner()


@pytest.fixture(autouse=True)
def setup(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    pm = fakes.make_pm()
    monkeypatch.setattr(cli, "plugin_manager", lambda: pm)
    fake = types.ModuleType("rlweave.config.placement")
    fake.check_placement = lambda cfg, roles: []
    monkeypatch.setitem(sys.modules, "rlweave.config.placement", fake)
    Path("c.yaml").write_text(yaml.safe_dump(CONFIG))
    return pm


def test_version():
    result = runner.invoke(cli.app, ["--version"])
    assert (result.exit_code, result.output) == (0, "rlweave 0.1.0 (plugin API 1)\n")


def test_validate_ok_prints_a_summary():
    result = runner.invoke(cli.app, ["validate", "c.yaml", "roles.policy.devices=2"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "OK: c.yaml", "algorithm: grpo (policy, rollout)", "role policy: backend fsdp, pool default, devices 2",
        "role rollout: engine vllm, pool default, devices 1", "reward arith_exact (weight 1.0)"]


def test_validate_errors_exit_2_with_every_error():
    result = runner.invoke(cli.app, ["validate", "c.yaml", "roles.policy.backend=megatorn", "bad"])
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        "invalid config (2 errors):",
        "  command line: override 'bad': expected key.path=value, e.g. run.total_steps=20",
        "  c.yaml: roles.policy.backend: unknown training backend 'megatorn'. Choose one of: fsdp "
        "(rlweave-backend-fsdp 0.1.0), megatron (rlweave-backend-megatron 0.1.0). Did you mean 'megatron'?"]


def test_list_plugins_json_and_table(setup):
    def explode():
        raise ImportError("No module named 'flash_attn'")

    setup.register(fakes.plugin(rlweave_training_backends=explode), name="fa", distribution="rlweave-fa", version="0.0.1")
    rows = json.loads(runner.invoke(cli.app, ["list-plugins", "--json"]).output)
    by_name = {r["name"]: r for r in rows}
    assert by_name["fsdp"]["distribution"] == "rlweave-backend-fsdp" and by_name["fsdp"]["status"] == "ok"
    assert (by_name["fa"]["status"], by_name["fa"]["error"]) == ("broken", "ImportError: No module named 'flash_attn'")
    table = runner.invoke(cli.app, ["list-plugins"])
    assert table.exit_code == 0
    for word in ("megatron", "rlweave-backend-megatron", "broken", "flash_attn", "summary", "distribution"):
        assert word in table.output


def test_train_validates_first_and_does_not_start_the_runner_on_errors(monkeypatch):
    calls = []
    loop = types.ModuleType("rlweave.runner.loop")
    loop.run = lambda *a, **k: calls.append((a, k))
    monkeypatch.setitem(sys.modules, "rlweave.runner.loop", loop)
    result = runner.invoke(cli.app, ["train", "c.yaml", "run.total_steps=0"])
    assert result.exit_code == 2 and calls == []
    assert "c.yaml: run.total_steps: Input should be greater than or equal to 1 (got 0)" in result.output


def test_train_writes_the_run_dir_and_calls_the_runner(monkeypatch, tmp_path):
    calls = []
    loop = types.ModuleType("rlweave.runner.loop")
    loop.run = lambda cfg, **kw: calls.append((cfg, kw))
    loop.RunInterrupted = type("RunInterrupted", (RuntimeError,), {})
    monkeypatch.setitem(sys.modules, "rlweave.runner.loop", loop)
    result = runner.invoke(cli.app, ["train", "c.yaml", "run.seed=3", "--resume", "--address", "10.0.0.1:6379"])
    assert result.exit_code == 0, result.output
    (cfg, kw), = calls
    assert cfg.ray.address == "10.0.0.1:6379" and cfg.run.seed == 3
    assert kw == {"config_path": Path("c.yaml"), "run_dir": Path("runs/demo"), "resume": True}
    assert (tmp_path / "runs/demo/config.resolved.yaml").is_file() and (tmp_path / "runs/demo/plugins.json").is_file()
    runner.invoke(cli.app, ["train", "c.yaml", "--run-dir", "elsewhere"])
    assert calls[1][1]["run_dir"] == Path("elsewhere") and calls[1][1]["resume"] is False


def test_train_without_a_runner_says_it_is_not_implemented(monkeypatch):
    monkeypatch.setitem(sys.modules, "rlweave.runner.loop", None)  # import raises ImportError
    result = runner.invoke(cli.app, ["train", "c.yaml"])
    assert result.exit_code == 1
    assert "error: training is not implemented in this rlweave installation (rlweave.runner.loop is missing" \
        in result.output
