"""A run SIGKILLed while it writes a checkpoint resumes from the previous complete one and ends
exactly where an uninterrupted run does (``rlweave train`` in a subprocess: tiny fp32 GRPO on
CPU, HF engine, FSDP policy, Ray, checkpoints every 2 steps).

The shared 4-step reference run (``reference_run``, trained straight through) vs. the same config
SIGKILLed while its step-4 checkpoint is being written (``RLWEAVE_CHECKPOINT_DELAY_S`` holds the
save open) and continued with ``--resume``: the interrupted save never looks complete, the resume
starts from step 2, the final weights are bitwise equal (max |Δ| 0) and every step's metrics (all
but wall-clock times) are equal. The run must update the policy after the resume point, or the
comparison would prove nothing; the checkpoint it resumed from verifies and holds its RNG and
schedule state as JSON/safetensors (no ``.pkl``/``.pt``).
"""

from __future__ import annotations

import signal

import pytest
from rlweave.runner.checkpoint import CheckpointManager
from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli

pytestmark = pytest.mark.slow


def _comparable(row: dict) -> dict:
    """A metrics row without its wall-clock entries (timestamp, durations)."""
    return {k: v for k, v in row.items()
            if k != "time" and not k.startswith("time/") and not k.endswith(("_seconds", "_s"))}


def test_resume_after_a_kill_during_a_save_equals_an_uninterrupted_run(guarantee, reference_run, tmp_path):
    from safetensors.torch import load_file

    cfg, straight = reference_run.config, reference_run.run_dir
    cut = tmp_path / "cut"
    ckpts = cut / "checkpoints"
    rc, out, killed = run_cli(["train", str(cfg), "--run-dir", str(cut)], cli_env(RLWEAVE_CHECKPOINT_DELAY_S="30"),
                              timeout=900, kill_when=lambda: (ckpts / ".tmp-step_000004" / "rng.json").exists())
    assert rc == -signal.SIGKILL, out[-4000:]
    assert (ckpts / "step_000002" / "COMPLETE").exists()
    assert not (ckpts / "step_000004").exists()  # the interrupted save never looks complete
    leftovers(killed, grace_s=2.0)  # whatever the killed driver left (Ray reaps its own; a safety net)
    pids: set[int] = set()
    try:
        rc, out, pids = run_cli(["train", str(cfg), "--resume", "--run-dir", str(cut)], cli_env(), timeout=900)
        assert rc == 0, out[-4000:]
        assert "step_000002" in out and "resumed from" in out
    finally:
        left = leftovers(pids)
    assert not left, f"processes left behind: {left}"

    resumed_from = ckpts / "step_000002"
    files = sorted(str(p.relative_to(resumed_from)) for p in resumed_from.rglob("*") if p.is_file())
    assert CheckpointManager.verify(resumed_from) == [], files  # a checksummed, pickle-free checkpoint
    assert "rng.json" in files and "roles/policy/extra_rank0.json" in files, files
    assert not [f for f in files if f.endswith((".pkl", ".pt"))], files
    a = load_file(str(straight / "hf" / "model.safetensors"))
    b = load_file(str(cut / "hf" / "model.safetensors"))
    assert a.keys() == b.keys() and a
    max_diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    ref = {r["step"]: _comparable(r) for r in metrics_rows(straight)}
    got = {r["step"]: _comparable(r) for r in metrics_rows(cut)}
    assert sorted(s for s in got if s >= 1) == list(range(1, 5))
    trained_after = [s for s in range(3, 5) if ref[s]["grad_norm"] > 0]
    assert trained_after, "no update after the resume point: the comparison would prove nothing"
    unequal = [(s, k, ref[s].get(k), got[s].get(k)) for s in range(1, 5)
               for k in sorted(set(ref[s]) | set(got[s])) if ref[s].get(k) != got[s].get(k)]
    if max_diff != 0.0 or unequal:
        pytest.fail(f"resumed run differs: max |Δweight| {max_diff:.3e}; unequal metrics {unequal[:6]}")
    n_keys = len(ref[4])
    guarantee("resume equals an uninterrupted run",
              f"4 steps straight vs SIGKILL while saving step 4 + --resume from step 2: "
              f"{len(a)} weight tensors bitwise equal (max |Δ| {max_diff:g}; updates after the resume point at "
              f"steps {', '.join(map(str, trained_after))}), {n_keys} metrics x 4 steps equal (wall-clock times "
              "excluded); tiny fp32 GRPO, HF engine, FSDP policy, CPU")
