"""``rlweave validate`` and ``rlweave train`` on a vision-language model check the images of the
data head before anything starts: a bad image record ends both with exit code 2 and a line naming
the data file, the line and the field, and ``train`` writes no run directory. The installed
plugins are used (FSDP policy, HF engine, GRPO) on a tiny random Qwen2-VL built once."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from rlweave import cli as rlweave_cli
from typer.testing import CliRunner

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    from PIL import Image
    from rlweave.testing.tiny_vlm import build_tiny_qwen2_vl, vision_tokenizer

    root = tmp_path_factory.mktemp("vision-inputs")
    build_tiny_qwen2_vl(root / "model", vision_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789 ?.,:+="]))
    (root / "img").mkdir()
    buf = io.BytesIO()
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(buf, "PNG")
    (root / "img" / "ok.png").write_bytes(buf.getvalue())
    (root / "img" / "bad.png").write_bytes(b"not an image")
    rows = {"good.jsonl": [{"prompt": f"{IMAGE}which?", "images": ["img/ok.png"], "answer": 1}],
            "bad.jsonl": [{"prompt": f"{IMAGE}which?", "images": ["img/ok.png"], "answer": 1},
                          {"messages": [{"role": "user", "content": [{"type": "image"},
                                                                     {"type": "text", "text": "?"}]}],
                           "images": ["img/bad.png"], "answer": 2}]}
    for name, recs in rows.items():
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    config = {
        "run": {"name": "vlm", "output_dir": "runs", "total_steps": 1, "scheduler": "in_process"},
        "model": {"path": "model", "vision": {"min_pixels": 256, "max_pixels": 1024}},
        "resources": {"pools": {"default": {"devices_per_node": 2}}},
        "roles": {"policy": {"backend": "fsdp", "devices": 1, "optim": {"lr": 1.0e-4}},
                  "rollout": {"engine": "hf", "devices": 1}},
        "algorithm": {"name": "grpo", "n_samples": 2, "max_new_tokens": 8},
        "rewards": [{"name": "arith_exact"}],
        "data": {"train": "good.jsonl", "batch_size": 1},
    }
    (root / "c.yaml").write_text(json.dumps(config))
    return root


@pytest.fixture
def rlweave(workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    runner = CliRunner()
    return lambda *args: runner.invoke(rlweave_cli.app, [str(a) for a in args])


def test_image_records_validate(rlweave):
    result = rlweave("validate", "c.yaml")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_bad_image_stops_the_command_naming_file_line_and_field(rlweave, workspace, command):
    result = rlweave(command, "c.yaml", "data.train=bad.jsonl")
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("invalid config: c.yaml: data.train: bad.jsonl line 2: field 'messages': image 0: cannot "
                           "decode the image"), line
    assert not (workspace / "runs").exists(), "train must stop before it writes its run directory"
