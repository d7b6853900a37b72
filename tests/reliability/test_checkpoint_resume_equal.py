"""A resumed run ends exactly where an uninterrupted one does (``rlweave train`` in a
subprocess: tiny fp32 GRPO on CPU, HF engine, FSDP policy, checkpoints every 5 steps).

10 steps straight vs. the same run stopped (SIGTERM) once its step-5 checkpoint is complete
and continued with ``--resume``: the final weights are bitwise equal (max |Δ| 0) and every
step's metrics (all but wall-clock times) are equal. The run must update the policy after the
resume point, or the comparison would prove nothing; the checkpoint it resumed from verifies
and holds its RNG and schedule state as JSON/safetensors (no ``.pkl``/``.pt``).
"""

from __future__ import annotations

import signal

import pytest
from rlweave.runner.checkpoint import CheckpointManager
from rlweave.testing.runs import cli_env, leftovers, metrics_rows, run_cli

pytestmark = pytest.mark.slow
UPDATES = {"ppo_epochs": 2, "mini_batches": 2}  # two updates per step


def _comparable(row: dict) -> dict:
    """A metrics row without its wall-clock entries (timestamp, durations)."""
    return {k: v for k, v in row.items()
            if k != "time" and not k.startswith("time/") and not k.endswith(("_seconds", "_s"))}


def test_resume_equals_an_uninterrupted_run(guarantee, grpo_workspace):
    from safetensors.torch import load_file

    tmp = grpo_workspace.root
    env = cli_env()
    pids: set[int] = set()
    try:
        straight = grpo_workspace.config("straight", steps=10, run={"save_every": 5}, algorithm=UPDATES)
        rc, out, seen = run_cli(["train", str(straight)], env, timeout=900)
        pids |= seen
        assert rc == 0, out[-4000:]

        cut = grpo_workspace.config("cut", steps=10, run={"save_every": 5}, algorithm=UPDATES)
        marker = tmp / "runs" / "cut" / "checkpoints" / "step_000005" / "COMPLETE"
        rc, out, seen = run_cli(["train", str(cut)], env, timeout=900, sig=signal.SIGTERM,
                                kill_when=marker.exists)
        pids |= seen
        assert rc == 128 + signal.SIGTERM, out[-4000:]
        rows_before = [r["step"] for r in metrics_rows(tmp / "runs" / "cut") if r["step"] >= 1]
        rc, out, seen = run_cli(["train", str(cut), "--resume"], env, timeout=900)
        pids |= seen
        assert rc == 0, out[-4000:]
        assert "step_000005" in out and "resumed from" in out
    finally:
        left = leftovers(pids)
    assert not left, f"processes left behind: {left}"

    resumed_from = tmp / "runs" / "cut" / "checkpoints" / "step_000005"
    files = sorted(str(p.relative_to(resumed_from)) for p in resumed_from.rglob("*") if p.is_file())
    assert CheckpointManager.verify(resumed_from) == [], files  # a checksummed, pickle-free checkpoint
    assert "rng.json" in files and "roles/policy/extra_rank0.json" in files, files
    assert not [f for f in files if f.endswith((".pkl", ".pt"))], files
    a = load_file(str(tmp / "runs" / "straight" / "hf" / "model.safetensors"))
    b = load_file(str(tmp / "runs" / "cut" / "hf" / "model.safetensors"))
    assert a.keys() == b.keys() and a
    max_diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    ref = {r["step"]: _comparable(r) for r in metrics_rows(tmp / "runs" / "straight")}
    got = {r["step"]: _comparable(r) for r in metrics_rows(tmp / "runs" / "cut")}
    assert sorted(s for s in got if s >= 1) == list(range(1, 11))
    trained_after = [s for s in range(6, 11) if ref[s]["grad_norm"] > 0]
    assert trained_after, "no update after the resume point: the comparison would prove nothing"
    unequal = [(s, k, ref[s].get(k), got[s].get(k)) for s in range(1, 11)
               for k in sorted(set(ref[s]) | set(got[s])) if ref[s].get(k) != got[s].get(k)]
    if max_diff != 0.0 or unequal:
        pytest.fail(f"resumed run differs: max |Δweight| {max_diff:.3e}; unequal metrics {unequal[:6]}")
    n_keys = len(ref[10])
    guarantee("resume equals an uninterrupted run",
              f"10 steps straight vs 5 + --resume 5 (stopped during step {max(rows_before) + 1}): "
              f"{len(a)} weight tensors bitwise equal (max |Δ| {max_diff:g}; updates after the resume point at "
              f"steps {', '.join(map(str, trained_after))}), {n_keys} metrics x 10 steps equal (wall-clock times "
              "excluded); tiny fp32 GRPO, HF engine, FSDP policy, CPU")
