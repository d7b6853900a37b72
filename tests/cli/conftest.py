"""Fixtures of the command tests: one tiny trained run shared by the whole session.

``trained_run`` builds the arithmetic task's tiny Qwen2 workspace (``tests/conftest.py``:
random weights, a locally trained tokenizer, 64 train and 16 test prompts) and trains it for
two GRPO steps through ``rlweave train`` in a subprocess (FSDP policy, HF rollout engine, both
in the controller's process: ``run.scheduler: in_process``), saving a checkpoint after each
step. Besides ``arith_exact`` the run is rewarded by response length, so every group has
different rewards and each step changes the weights. ``cli`` runs the command line in this
process (typer's runner, stderr kept apart).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from rlweave import cli as rlweave_cli
from rlweave.testing.runs import cli_env, length_reward, run_cli
from typer.testing import CliRunner

_E2E_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
_spec = importlib.util.spec_from_file_location("rlweave_e2e_conftest", _E2E_CONFTEST)
_e2e = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(_e2e)


@dataclass(frozen=True)
class TrainedRun:
    """``ws``: the workspace (``model``: the base model, ``test``: 16 held-out prompts with
    ``answer``); ``config``: the run's YAML; ``run_dir``: its run directory (checkpoints of
    steps 1 and 2, ``hf/`` at step 2, ``summary.json``)."""

    ws: object
    config: Path
    run_dir: Path


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> TrainedRun:
    ws = _e2e.build_grpo_workspace(tmp_path_factory.mktemp("cli"))
    rewards = [{"name": "arith_exact"}, {"name": length_reward(ws.root), "weight": 0.5}]
    config = ws.config("cli", 2, run={"save_every": 1, "keep_last": 2, "scheduler": "in_process"}, rewards=rewards)
    rc, out, _ = run_cli(["train", str(config)], cli_env())
    assert rc == 0, out[-4000:]
    return TrainedRun(ws, config, ws.root / "runs" / "cli")


@pytest.fixture
def cli():
    """``cli(*args)`` -> typer's ``Result`` of ``rlweave ARGS`` run in this process."""
    runner = CliRunner()
    return lambda *args: runner.invoke(rlweave_cli.app, [str(a) for a in args])


def _one_line_error(result, *fragments: str) -> str:
    """Assert ``result`` exited 2 with exactly one ``error: ...`` line on stderr (no traceback)
    containing every fragment; return the line."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), result.exception
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture
def expect_error():
    """``expect_error(result, *fragments)``: the command exited 2 with one ``error:`` line holding them."""
    return _one_line_error
