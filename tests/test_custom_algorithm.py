"""The local algorithm of ``examples/custom_algorithm`` (REINFORCE with a baseline, named
``reinforce_baseline:ReinforceBaseline``, no plugin) trains the tiny model for real: 3 steps through
``rlweave train`` with the FSDP policy and the HF engine on Ray. The module sits only in the
config's folder (not on PYTHONPATH, not in the current directory), so the controller finds it there
and its loss function reaches the policy's ranks by value. The code shown in
``docs/custom_algorithm.md`` is the example's own."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "custom_algorithm" / "reinforce_baseline.py"


def test_the_docs_show_the_example_as_it_is():
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "custom_algorithm.md").read_text(), re.DOTALL)
    source = EXAMPLE.read_text()
    assert len(blocks) >= 3
    for block in blocks:
        assert block in source, block


@pytest.mark.slow
def test_the_example_algorithm_trains_the_tiny_model(grpo_workspace, tmp_path):
    ws = grpo_workspace
    shutil.copy(EXAMPLE, ws.root / EXAMPLE.name)
    cfg = ws.config("reinforce", 3, run={"save_every": 3},
                    algorithm={"name": "reinforce_baseline:ReinforceBaseline", "baseline_decay": 0.5})
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    rc, out, pids = run_cli(["train", str(cfg)], cli_env(), cwd=elsewhere)
    assert rc == 0, out[-4000:]
    run_dir = ws.root / "runs" / "reinforce"
    steps = [r for r in metrics_rows(run_dir) if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        for key in ("reward/mean", "baseline", "loss", "grad_norm", "response_len/mean"):
            assert key in r and math.isfinite(r[key]), (key, r)
    assert any(r["grad_norm"] > 0 for r in steps)
    assert (run_dir / "checkpoints" / "step_000003" / "COMPLETE").is_file()
    before, after = load_file(ws.model / "model.safetensors"), load_file(run_dir / "hf" / "model.safetensors")
    assert set(before) == set(after)
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"
    assert not leftovers(pids)
