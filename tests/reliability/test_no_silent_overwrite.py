"""Nothing a user made is deleted or overwritten without an explicit flag (``rlweave train`` in a
subprocess, tiny fp32 GRPO on CPU):

* the same config trained again refuses (exit 2, no process started) and leaves the first run's
  checkpoints, ``hf/`` and metrics byte for byte as they were; so does a second start with a
  config error;
* ``--overwrite`` moves the first run aside intact, then the new run completes;
* ``--resume=required`` on a misspelled run name refuses; ``--resume`` says so on its first line.

The first run is a copy of the shared ``reference_run`` (4 steps, checkpoints at 2 and 4); the
two runs this test starts take one step with ``run.scheduler=in_process`` (what is proven here
is the run directory's handling, the same for every scheduler).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
from rlweave.testing.runs import cli_env, leftovers, run_cli

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def hashes(run_dir: Path) -> dict[str, str]:
    """``relative path -> sha256`` of every file of a run."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def train(*args: str) -> tuple[int, str, float]:
    """``rlweave train ARGS``; asserts nothing it started outlives it."""
    t0 = time.monotonic()
    rc, out, pids = run_cli(["train", *args], cli_env(), cwd=REPO, timeout=400)
    took = time.monotonic() - t0
    assert not leftovers(pids, grace_s=0.5)
    return rc, out, took


def test_an_earlier_run_is_never_replaced_without_a_flag(reference_run, tmp_path, guarantee):
    runs = tmp_path / "runs"
    first = reference_run.copy(runs / "keep")
    config = json.loads(reference_run.config.read_text())  # JSON is YAML
    config["run"].update(name="keep", output_dir=str(runs))
    cfg = tmp_path / "keep.yaml"
    cfg.write_text(json.dumps(config))
    one_step = ("run.total_steps=1", "run.scheduler=in_process")
    before = hashes(first)
    assert {"checkpoints/step_000002/COMPLETE", "checkpoints/step_000004/COMPLETE", "hf/model.safetensors",
            "metrics.jsonl", "summary.json"} <= before.keys()

    # the same config again, and again with a config error: exit 2 before anything is written or started
    rc, out, refused_s = train(str(cfg))
    assert rc == 2, out[-3000:]
    assert out.startswith(f"error: {first} already holds a run (last complete checkpoint: step 4 (2 complete); "
                          "metrics up to step 4; hf/ (an exported model); summary.json (a finished run))"), out
    assert "--resume" in out and "run.name=keep-2" in out and "--overwrite" in out
    rc, out, _ = train(str(cfg), "run.total_steps=0")
    assert rc == 2 and "run.total_steps" in out, out[-3000:]
    assert hashes(first) == before and sorted(p.name for p in runs.iterdir()) == ["keep"]

    # --overwrite: the first run moves aside intact; the new one completes in its place
    rc, out, _ = train(str(cfg), "--overwrite", *one_step)
    assert rc == 0, out[-3000:]
    (moved,) = [p for p in runs.iterdir() if p.name.startswith("keep.replaced-")]
    assert out.splitlines()[0].startswith("--overwrite: moved the earlier run") and str(moved) in out.splitlines()[0]
    assert hashes(moved) == before
    assert json.loads((first / "summary.json").read_text())["steps"] == 1 and (first / "hf/model.safetensors").is_file()

    # a misspelled run name: --resume=required refuses; --resume says so first, then starts from step 0
    rc, out, _ = train(str(cfg), "run.name=kepe", "--resume=required")
    assert rc == 2, out[-3000:]
    assert out == (f"error: --resume=required: nothing to resume in {runs / 'kepe'}: the directory does not exist "
                   "(is the run name spelled right? did you mean 'keep'?). Nothing was changed.\n")
    assert not (runs / "kepe").exists()
    rc, out, _ = train(str(cfg), "run.name=kepe", "--resume", *one_step)
    assert rc == 0, out[-3000:]
    assert out.splitlines()[0] == (f"--resume: nothing to resume in {runs / 'kepe'}: the directory does not exist (is "
                                   "the run name spelled right? did you mean 'keep'?); starting from step 0 "
                                   "(--resume=required refuses instead)")
    assert json.loads((runs / "kepe" / "summary.json").read_text())["resumed_from"] is None
    guarantee("nothing a user made is deleted or overwritten without an explicit flag",
              f"2nd train of a finished run: exit 2 in {refused_s:.1f} s, no process started, its {len(before)} files "
              "(checkpoints 2 and 4, hf/, metrics) byte-identical, also after a 2nd start with a config error; "
              f"--overwrite moved all {len(before)} intact to {moved.name}; --resume=required on a misspelled name: "
              "exit 2; --resume on it: said so on line 1")
