"""MetricsLogger (jsonl + TensorBoard), plot_metrics, progress output."""

import io
import json
import logging
import math
import sys

from rlweave.runner.metrics import MetricsLogger, read_metrics
from rlweave.runner.plot import plot_metrics
from rlweave.runner.progress import PhaseTimer, Progress, format_duration, format_status


def test_jsonl_and_tensorboard(tmp_path):
    import numpy as np

    with MetricsLogger(tmp_path) as m:
        m.log(1, {"reward_mean": 0.25, "kl": np.float32(0.5), "note": "x", "bad": math.nan})
        m.log(2, {"reward_mean": 0.5, "eval_accuracy": 0.4})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["kl"] == 0.5 and rows[0]["bad"] is None and rows[0]["note"] == "x"
    assert rows[1]["eval_accuracy"] == 0.4 and "time" in rows[1]
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("reward_mean")] == [0.25, 0.5]


def test_resume_truncates_later_rows_and_no_tensorboard(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with caplog.at_level(logging.WARNING, logger="rlweave.metrics"):
        with MetricsLogger(tmp_path) as m:
            for s in range(1, 6):
                m.log(s, {"loss": float(s)})
    assert "TensorBoard not available" in caplog.text
    assert not (tmp_path / "tensorboard").exists()
    with MetricsLogger(tmp_path, tensorboard=False, start_step=3) as m:
        m.log(4, {"loss": 40.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_plot(tmp_path):
    jl = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "reward_mean": s / 10} for s in range(1, 11)] + [{"step": 0, "eval_accuracy": 0.2},
                                                                           {"step": 10, "eval_accuracy": 0.5}]
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn')
    out = plot_metrics(jl, tmp_path / "plots" / "m.png", ["reward_mean", "eval_accuracy", "absent"])
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_status_line():
    line = format_status(3, 50, {"reward_mean": 0.41, "kl": 0.002, "loss": 1.5},
                         {"gen": 5.1, "train": 6.0, "sync": 0.4, "total": 12.3})
    assert line == "step 3/50 | reward 0.41 | kl 0.002 | loss 1.5 | 12.3s (gen 5.1 train 6.0 sync 0.4)"
    assert format_status(1, 2, {"x": 1e-5}, fields=[("x", "x")]) == "step 1/2 | x 1.00e-05"
    # phases under 0.05 s left out; the time left
    line = format_status(1, 9, {"loss": 2.0}, {"train": 2.0, "sync": 0.01, "total": 2.1}, eta_s=581)
    assert line == "step 1/9 | loss 2 | 2.1s (train 2.0) | eta 9m41s"
    assert format_duration(42.4) == "42s" and format_duration(7500) == "2h05m"


def test_progress_eta_is_the_mean_pace_of_its_steps(monkeypatch):
    clock = iter([100.0, 110.0, 130.0])
    monkeypatch.setattr("rlweave.runner.progress.time.perf_counter", lambda: next(clock))
    p = Progress(10, stream=io.StringIO(), initial=2)  # resumed at step 2: 8 steps to go
    assert p.eta(2) is None
    assert p.eta(4) == 5.0 * 6  # 2 steps in 10 s, 6 left
    assert p.eta(10) == 0.0


def test_progress_without_tty_prints_lines_only():
    buf = io.StringIO()
    with Progress(3, stream=buf) as p:
        for s in range(1, 4):
            p.update(s, f"step {s}/3")
        p.write("eval acc 0.5")
    assert buf.getvalue().splitlines() == ["step 1/3", "step 2/3", "step 3/3", "eval acc 0.5"]
    buf = io.StringIO()
    with Progress(3, stream=buf, bar=True) as p:  # forced bar on a non-tty stream still works
        p.update(1, "step 1/3")
    assert "step 1/3" in buf.getvalue() and "1/3" in buf.getvalue()


def test_phase_timer():
    t = PhaseTimer()
    with t.phase("gen"):
        pass
    with t.phase("gen"):
        pass
    times = t.times()
    assert set(times) == {"gen", "total"} and times["total"] >= times["gen"] >= 0


def test_modules_stay_light():
    import subprocess

    code = (
        "import sys\n"
        "import rlweave.rewards, rlweave.rewards.plugin, rlweave.rewards.rules, rlweave.rewards.reward_set\n"
        "import rlweave.runner.data, rlweave.data.records, rlweave.runner.checkpoint, rlweave.runner.metrics\n"
        "import rlweave.runner.plot, rlweave.runner.progress, rlweave.data.chat, rlweave.data.formats\n"
        "import rlweave.loggers.tensorboard, rlweave.loggers.wandb, rlweave.loggers.mlflow\n"
        "import rlweave.config.hub, rlweave.config.inputs\n"
        "heavy = [m for m in ('torch', 'ray', 'vllm', 'matplotlib', 'tensorboard', 'transformers', 'wandb', 'mlflow',\n"
        "                     'pyarrow', 'datasets', 'huggingface_hub') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
