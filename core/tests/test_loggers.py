"""Metrics backends beside metrics.jsonl: Weights & Biases (offline) and MLflow (local file
store) write real files here, read back below; resumes continue the same external run;
unknown or uninstalled loggers are config errors before anything starts."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
import yaml
from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config
from rlweave.config.schema import RunConfig
from rlweave.loggers import LoggerUnavailable
from rlweave.runner.metrics import MetricsLogger, read_metrics


def run_config(tmp_path: Path, **logging) -> RunConfig:
    return RunConfig.model_validate({"run": {"name": "tiny-run"}, "logging": logging})


def wandb_history(run_dir: Path) -> list[dict]:
    """History rows of every offline W&B run under ``run_dir/wandb``, read from the
    ``.wandb`` transaction logs (LevelDB log format: 7-byte file header, 32 KiB blocks,
    records with a 7-byte header ``crc, length, type``; each record a protobuf ``Record``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data = path.read_bytes()
        assert data[:4] == b":W&B"
        pos, pending = 7, b""
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            if left < 7:
                pos += left
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            pos += 7
            if kind == 0 and length == 0:
                break
            pending += data[pos:pos + length]
            pos += length
            if kind in (1, 4):  # FULL or LAST
                record = pb.Record()
                record.ParseFromString(pending)
                pending = b""
                if record.WhichOneof("record_type") == "history":
                    rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                 for item in record.history.item})
    return rows


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_wandb_offline_run_holds_the_logged_values(tmp_path, wandb_offline):
    run_dir = tmp_path / "run"
    cfg = run_config(tmp_path, backends=["jsonl", "wandb"], project="arith")
    with MetricsLogger(run_dir, config=cfg) as m:
        m.log(1, {"loss": 2.5, "eval/accuracy": 0.25, "note": "text", "ok": True})
        m.log(2, {"loss": 1.5, "eval/accuracy": 0.5})
    history = wandb_history(run_dir)
    assert [(r["_step"], r["loss"], r["eval/accuracy"]) for r in history] == [(1, 2.5, 0.25), (2, 1.5, 0.5)]
    assert "note" not in history[0] and "ok" not in history[0]  # numbers only
    assert [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl")] == [2.5, 1.5]  # jsonl always written
    assert not (run_dir / "tensorboard").exists()
    state = json.loads((run_dir / "loggers.json").read_text())
    assert state["wandb"]["project"] == "arith"
    assert [f"-{state['wandb']['id']}" in p.name for p in (run_dir / "wandb").glob("offline-run-*")] == [True]

    with MetricsLogger(run_dir, config=cfg, start_step=2) as m:  # a resume continues the same W&B run
        m.log(3, {"loss": 0.5})
    assert json.loads((run_dir / "loggers.json").read_text())["wandb"]["id"] == state["wandb"]["id"]
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(f"-{state['wandb']['id']}" in p.name for p in runs)  # "-1" within one second
    assert [(r["_step"], r["loss"]) for r in wandb_history(run_dir)][-1] == (3, 0.5)


def test_mlflow_file_store_holds_the_logged_values(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "mlruns"
    uri = store.as_uri()
    run_dir = tmp_path / "run"
    cfg = run_config(tmp_path, backends=["mlflow", "tensorboard"], project="arith", run_name="first try",
                     tracking_uri=uri)
    with MetricsLogger(run_dir, config=cfg) as m:
        m.log(1, {"loss": 2.5, "eval/accuracy": 0.25, "bad": float("nan"), "weird:key": 1.0,
                  "time/generate": 3.0, "time/generate/dispatch": 1.0})  # a name inside another one
        m.log(2, {"loss": 1.5})
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run_id = json.loads((run_dir / "loggers.json").read_text())["mlflow"]["run_id"]
    run = client.get_run(run_id)
    assert run.info.run_name == "first try" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "arith"
    assert [(x.step, x.value) for x in client.get_metric_history(run_id, "loss")] == [(1, 2.5), (2, 1.5)]
    assert [(x.step, x.value) for x in client.get_metric_history(run_id, "eval.accuracy")] == [(1, 0.25)]
    assert [x.value for x in client.get_metric_history(run_id, "time.generate")] == [3.0]
    assert [x.value for x in client.get_metric_history(run_id, "time.generate.dispatch")] == [1.0]
    assert [x.value for x in client.get_metric_history(run_id, "weird_key")] == [1.0]
    assert client.get_metric_history(run_id, "bad") == []  # non-finite values stay in the jsonl (as null)
    assert (store / run.info.experiment_id / run_id / "metrics" / "loss").is_file()

    # resumed: the same MLflow run, then a failure
    with pytest.raises(RuntimeError, match="boom"), MetricsLogger(run_dir, config=cfg, start_step=2) as m:
        m.log(3, {"loss": 0.5})
        raise RuntimeError("boom")
    assert [x.step for x in client.get_metric_history(run_id, "loss")] == [1, 2, 3]
    assert client.get_run(run_id).info.status == "FAILED"


def test_mlflow_defaults_to_a_store_inside_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "run"
    with MetricsLogger(run_dir, config=run_config(tmp_path, backends=["mlflow"])) as m:
        m.log(1, {"loss": 1.0})
    state = json.loads((run_dir / "loggers.json").read_text())["mlflow"]
    assert state["tracking_uri"] == (run_dir / "mlruns").resolve().as_uri() and state["experiment"] == "rlweave"
    assert list((run_dir / "mlruns").glob(f"*/{state['run_id']}/metrics/loss"))


def test_a_logger_whose_package_is_missing_is_one_line_naming_the_pip_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without wandb looks like to imports
    monkeypatch.chdir(tmp_path)
    Path("train.jsonl").write_text('{"prompt": "1+1=", "answer": 2}\n')
    Path("c.yaml").write_text(yaml.safe_dump({"logging": {"backends": ["wandb", "mlflow"]},
                                              "data": {"train": "train.jsonl"}, "algorithm": {"name": "none-here"}}))
    with pytest.raises(ConfigError) as err:
        load_config("c.yaml")
    lines = [str(i) for i in err.value.issues if i.path == "logging.backends"]
    assert lines == ["c.yaml: logging.backends: logger 'wandb' needs the wandb package, which is not installed: "
                     "pip install wandb (or pip install 'rlweave[wandb]')"]
    with pytest.raises(LoggerUnavailable, match=r"pip install wandb"):
        MetricsLogger(tmp_path / "run", config=run_config(tmp_path, backends=["wandb"]))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_unknown_loggers_are_named_with_the_known_ones(tmp_path, monkeypatch):
    from rlweave import cli
    from typer.testing import CliRunner

    monkeypatch.chdir(tmp_path)
    Path("c.yaml").write_text(yaml.safe_dump({"logging": {"backends": ["jsonl", "wandbb", "neptune"]}}))
    result = CliRunner().invoke(cli.app, ["validate", "--schema-only", "c.yaml"])
    assert result.exit_code == 2
    assert ("  c.yaml: logging.backends: unknown loggers 'wandbb' (did you mean 'wandb'?), 'neptune'; known loggers: "
            "jsonl, tensorboard, wandb, mlflow") in result.output.splitlines()
    with pytest.raises(ValueError, match="listed twice: mlflow"):
        RunConfig.model_validate({"logging": {"backends": ["mlflow", "mlflow"]}})
    assert RunConfig().logging.backends == ["jsonl", "tensorboard"]  # the default: what runs wrote before
