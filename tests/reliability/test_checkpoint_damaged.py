"""A damaged checkpoint is detected, never loaded (``rlweave train`` in a subprocess: tiny fp32
GRPO on CPU, HF engine, FSDP policy, checkpoints at steps 2 and 4: a copy of the shared
``reference_run``).

64 bytes flipped in the policy's DCP shard of the newest checkpoint: ``--resume`` names the
file, warns, falls back to the previous checkpoint and finishes (and the damaged one is
replaced by a new, verifying save; that run is in process, ``run.scheduler=in_process``). With
the damaged checkpoint alone it refuses: exit code 1, an error naming the file, no traceback,
nothing started.
"""

from __future__ import annotations

import shutil
import time

import pytest
from rlweave.runner.checkpoint import CheckpointManager
from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli
from rlweave.testing.tamper import flip_bytes

pytestmark = pytest.mark.slow
SHARD = "roles/policy/__0_0.distcp"


def test_damaged_checkpoint_is_detected(guarantee, reference_run, tmp_path):
    cfg = reference_run.config
    run_dir = reference_run.copy(tmp_path / "damaged")
    env = cli_env()
    pids: set[int] = set()
    try:
        ckpts = run_dir / "checkpoints"
        assert sorted(p.name for p in ckpts.iterdir()) == ["step_000002", "step_000004"]
        offset = flip_bytes(ckpts / "step_000004" / SHARD, 64)
        alone = tmp_path / "alone"  # the same run with only the damaged checkpoint left
        shutil.copytree(run_dir, alone)
        shutil.rmtree(alone / "checkpoints" / "step_000002")

        t0 = time.monotonic()
        rc, out, seen = run_cli(["train", str(cfg), "--resume", "--run-dir", str(run_dir), "run.scheduler=in_process"],
                                env, timeout=900)
        pids |= seen
        assert rc == 0, out[-4000:]
        fallback_s = time.monotonic() - t0
        for words in ("step_000004", f"{SHARD}: checksum mismatch", "falling back", "resumed from",
                      "step_000002"):
            assert words in out, (words, out[-4000:])
        assert sorted(r["step"] for r in metrics_rows(run_dir) if r["step"] >= 1) == [1, 2, 3, 4]
        assert CheckpointManager.verify(ckpts / "step_000004") == []  # saved again, intact

        t0 = time.monotonic()
        rc, out, seen = run_cli(["train", str(cfg), "--resume", "--run-dir", str(alone)], env, timeout=300)
        pids |= seen
        refuse_s = time.monotonic() - t0
    finally:
        left = leftovers(pids)
    assert not left, f"processes left behind: {left}"
    assert rc == 1, out[-4000:]
    assert f"step_000004: {SHARD}: checksum mismatch" in out and "error:" in out, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert (alone / "checkpoints" / "step_000004" / "COMPLETE").is_file()  # left as it was
    guarantee("a damaged checkpoint is detected",
              f"64 bytes flipped at offset {offset} of {SHARD} in the newer of 2 checkpoints: --resume named the "
              f"file, warned, fell back to step 2 and finished 4 steps (exit 0, {fallback_s:.0f} s); with the "
              f"damaged checkpoint alone it refused with exit code 1, no traceback, in {refuse_s:.1f} s")
