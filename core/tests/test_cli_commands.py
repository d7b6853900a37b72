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
_spec = importlib.util.spec_from_file_location("rlweave_test_run_dirs", Path(__file__).parent / "run_dir_fixtures.py")
run_dirs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_dirs)
make_run, fingerprint = run_dirs.make_run, run_dirs.fingerprint

CONFIG = {"run": {"name": "demo", "output_dir": "runs"}, "algorithm": {"name": "grpo"},
          "roles": {"policy": {"backend": "fsdp"}, "rollout": {"engine": "vllm"}},
          "rewards": [{"name": "arith_exact"}]}
runner = CliRunner()


@pytest.fixture(autouse=True)
def setup(monkeypatch, tmp_path, use_plugins):
    monkeypatch.chdir(tmp_path)
    pm = use_plugins(fakes.make_pm())
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
    make_run(tmp_path / "runs/demo", checkpoints=(2,), metrics_to=2, hf=False, summary=False)
    result = runner.invoke(cli.app, ["train", "c.yaml", "run.seed=3", "--resume", "--address", "10.0.0.1:6379"])
    assert result.exit_code == 0, result.output
    (cfg, kw), = calls
    assert cfg.ray.address == "10.0.0.1:6379" and cfg.run.seed == 3
    assert kw == {"config_path": Path("c.yaml"), "run_dir": Path("runs/demo"), "resume": True, "overwrite": False}
    assert (tmp_path / "runs/demo/config.resolved.yaml").is_file() and (tmp_path / "runs/demo/plugins.json").is_file()
    runner.invoke(cli.app, ["train", "c.yaml", "--run-dir", "elsewhere"])
    assert calls[1][1]["run_dir"] == Path("elsewhere") and calls[1][1]["resume"] is False


def test_train_without_a_runner_says_it_is_not_implemented(monkeypatch):
    monkeypatch.setitem(sys.modules, "rlweave.runner.loop", None)  # import raises ImportError
    result = runner.invoke(cli.app, ["train", "c.yaml"])
    assert result.exit_code == 1
    assert "error: training is not implemented in this rlweave installation (rlweave.runner.loop is missing" \
        in result.output


@pytest.fixture
def fake_runner(monkeypatch):
    """A runner module whose ``run`` only records its calls."""
    calls = []
    loop = types.ModuleType("rlweave.runner.loop")
    loop.run = lambda cfg, **kw: calls.append(kw)
    loop.RunInterrupted = type("RunInterrupted", (RuntimeError,), {})
    monkeypatch.setitem(sys.modules, "rlweave.runner.loop", loop)
    return calls


@pytest.mark.parametrize("extra, hint", [([], "run.name=demo-2"),
                                         (["--run-dir", "runs/demo"], "--run-dir runs/demo-2")])
def test_train_refuses_a_directory_holding_a_run_and_changes_nothing(fake_runner, tmp_path, extra, hint):
    earlier = make_run(tmp_path / "runs/demo")
    before = fingerprint(earlier)
    result = runner.invoke(cli.app, ["train", "c.yaml", *extra])
    assert result.exit_code == 2 and fake_runner == [], result.output
    lines = result.output.splitlines()
    assert lines[0] == ("error: runs/demo already holds a run (last complete checkpoint: step 4 (2 complete); metrics "
                        "up to step 4; hf/ (an exported model); summary.json (a finished run)); a fresh start would "
                        "replace it, so nothing was changed. Choose one:")
    assert lines[1].split() == ["--resume", "continue", "it", "from", "its", "last", "complete", "checkpoint",
                                "(step", "4)"]
    assert lines[2].split()[:len(hint.split())] == hint.split() and "start a new run beside it" in lines[2]
    assert "--overwrite" in lines[3] and "runs/demo.replaced-<UTC time> (nothing is deleted)" in lines[3]
    assert fingerprint(earlier) == before  # not even config.resolved.yaml was rewritten
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["demo"]


def test_train_overwrite_moves_the_earlier_run_aside_intact(fake_runner, tmp_path):
    earlier = make_run(tmp_path / "runs/demo")
    before = fingerprint(earlier)
    result = runner.invoke(cli.app, ["train", "c.yaml", "--overwrite"])
    assert result.exit_code == 0, result.output
    (moved,) = [p for p in (tmp_path / "runs").iterdir() if p.name != "demo"]
    assert moved.name.startswith("demo.replaced-") and moved.name.endswith("Z")
    assert fingerprint(moved) == before
    assert result.output.splitlines()[0] == (
        "--overwrite: moved the earlier run (last complete checkpoint: step 4 (2 complete); metrics up to step 4; "
        f"hf/ (an exported model); summary.json (a finished run)) from runs/demo to runs/{moved.name}; starting fresh")
    assert sorted(p.name for p in earlier.iterdir()) == ["config.resolved.yaml", "plugins.json"]
    assert fake_runner[0]["overwrite"] is True and fake_runner[0]["resume"] is False


def test_train_resume_and_overwrite_together_is_a_usage_error(fake_runner, tmp_path):
    earlier = make_run(tmp_path / "runs/demo")
    before = fingerprint(earlier)
    result = runner.invoke(cli.app, ["train", "c.yaml", "--resume", "--overwrite"])
    assert result.exit_code == 2 and fake_runner == []
    assert result.output == ("error: --resume and --overwrite exclude each other: --resume continues the run in the "
                             "run directory, --overwrite moves it aside and starts fresh\n")
    assert fingerprint(earlier) == before


def test_train_resume_without_a_checkpoint_says_so_first_and_starts_from_step_0(fake_runner, tmp_path):
    make_run(tmp_path / "runs/demo")
    result = runner.invoke(cli.app, ["train", "c.yaml", "run.name=dmeo", "--resume"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == (
        "--resume: nothing to resume in runs/dmeo: the directory does not exist (is the run name spelled right? "
        "did you mean 'demo'?); starting from step 0 (--resume=required refuses instead)")
    assert result.output.splitlines()[1] == "run directory: runs/dmeo"
    assert fake_runner[0]["resume"] is False  # already reported: the runner does not say it again


def test_train_resume_required_without_a_checkpoint_refuses(fake_runner, tmp_path):
    make_run(tmp_path / "runs/demo")
    result = runner.invoke(cli.app, ["train", "c.yaml", "run.name=dmeo", "--resume=required"])
    assert result.exit_code == 2 and fake_runner == [], result.output
    assert result.output == ("error: --resume=required: nothing to resume in runs/dmeo: the directory does not exist "
                             "(is the run name spelled right? did you mean 'demo'?). Nothing was changed.\n")
    assert not (tmp_path / "runs/dmeo").exists()
    result = runner.invoke(cli.app, ["train", "c.yaml", "--resume=required"])  # the real name resumes
    assert result.exit_code == 0 and fake_runner[0]["resume"] == "required", result.output
    result = runner.invoke(cli.app, ["train", "c.yaml", "--resume=yes"])
    assert result.exit_code == 2 and "error: --resume takes no value or '=required', got --resume=yes" in result.output


def test_train_resume_refuses_a_run_without_a_checkpoint(fake_runner, tmp_path):
    """Trained steps but no complete checkpoint: a start from step 0 would replace them."""
    earlier = make_run(tmp_path / "runs/demo", checkpoints=(), metrics_to=3, hf=False, summary=False, partial=4)
    before = fingerprint(earlier)
    result = runner.invoke(cli.app, ["train", "c.yaml", "--resume"])
    assert result.exit_code == 2 and fake_runner == []
    assert result.output.startswith(
        "error: --resume: runs/demo holds a run with no complete checkpoint to continue from (no complete "
        "checkpoint; metrics up to step 3); starting it over from step 0 would replace it, so nothing was changed.")
    assert "--overwrite (instead of --resume)" in result.output and "run.name=demo-2" in result.output
    assert fingerprint(earlier) == before


def test_train_retries_over_what_a_start_without_a_step_left(fake_runner, tmp_path):
    """A start that failed before its first step blocks nothing; its outputs are set aside, not deleted."""
    left = make_run(tmp_path / "runs/demo", checkpoints=(0,), metrics_to=0, hf=False, summary=False, partial=2)
    (left / "workers.json").write_text("{}")
    before = {k: v for k, v in fingerprint(left).items() if k.split("/")[0] in ("metrics.jsonl", "tensorboard",
                                                                                "checkpoints")}
    result = runner.invoke(cli.app, ["train", "c.yaml"])
    assert result.exit_code == 0, result.output
    (aside,) = (left / "earlier-starts").iterdir()
    assert fingerprint(aside) == before
    assert result.output.splitlines()[0] == ("moved what an earlier start left before its first step (metrics.jsonl, "
                                             f"tensorboard, checkpoints) to runs/demo/earlier-starts/{aside.name}")
    assert sorted(p.name for p in left.iterdir()) == ["config.resolved.yaml", "earlier-starts", "plugins.json",
                                                      "workers.json"]
    assert fake_runner[0]["resume"] is False


def test_validate_reports_both_passes_and_every_missing_path_together():
    Path("c.yaml").write_text(yaml.safe_dump({**CONFIG, "roles": {"policy": {"backend": "fsdp", "devices": 0},
                                                                  "rollout": {"engine": "vllm"}},
                                              "algorithm": {"name": "grpo", "group_sz": 4},
                                              "model": {"path": "models/sft"},
                                              "data": {"train": "data/train.jsonl", "eval": "data/test.jsonl"}}))
    result = runner.invoke(cli.app, ["validate", "c.yaml"], env={"HF_HUB_CACHE": "hf-cache"})
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        "invalid config (5 errors):",
        "  c.yaml: roles.policy.devices: Input should be greater than or equal to 1 (got 0)",
        "  c.yaml: algorithm.group_sz: unknown key. Did you mean 'group_size'?",
        "  c.yaml: model.path: 'models/sft' is neither a local directory nor a hub model in the Hugging Face cache "
        "(hf-cache): for a hub model, download it first with `hf download models/sft` (older huggingface_hub: "
        "`huggingface-cli download models/sft`); nothing is downloaded during a run",
        "  c.yaml: data.train: data file 'data/train.jsonl' does not exist",
        "  c.yaml: data.eval: data file 'data/test.jsonl' does not exist"]
    schema_only = runner.invoke(cli.app, ["validate", "c.yaml", "--schema-only"])
    assert schema_only.exit_code == 2 and "(2 errors)" in schema_only.output and "model.path" not in schema_only.output
    ok = runner.invoke(cli.app, ["validate", "--schema-only", "c.yaml", "roles.policy.devices=1", "algorithm={name: grpo}"])
    assert ok.exit_code == 0, ok.output
    assert ok.output.startswith("OK: c.yaml\n")


def test_list_plugins_shows_unavailable_records_with_their_reason(setup):
    setup.register(fakes.plugin(rlweave_inference_engines=lambda: [fakes.EngineRecord(
        "sglang", "SGLang engine", "x:y", probe=lambda: "SGLang is not installed")]),
        name="sglang", distribution="rlweave-infer-sglang", version="0.1.0")
    rows = json.loads(runner.invoke(cli.app, ["list-plugins", "--json"]).output)
    row = next(r for r in rows if r["name"] == "sglang")
    assert (row["status"], row["error"], row["distribution"]) == ("unavailable", "SGLang is not installed",
                                                                  "rlweave-infer-sglang")
    table = runner.invoke(cli.app, ["list-plugins"]).output
    line = next(l for l in table.splitlines() if "sglang" in l)
    assert "unavailable" in line and "SGLang is not installed" in table
