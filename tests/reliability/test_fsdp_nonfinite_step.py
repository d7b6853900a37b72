"""A NaN in one rank's loss skips the optimizer step on every rank of an FSDP role (CPU, 2
ranks over gloo), and no non-finite value reaches a checkpoint: saving refuses on every rank
before anything is written. Scenario: ``plugins/backend_fsdp/tests/reliability_scenarios.py``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rlweave.testing.helper_modules import import_helper

pytest.importorskip("rlweave_backend_fsdp")
tr = import_helper(Path(__file__).parents[2] / "plugins/backend_fsdp/tests/reliability_scenarios.py")


def test_nan_on_one_rank_skips_everywhere_and_never_reaches_a_checkpoint(guarantee, tmp_path):
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave.testing.ranks import run_ranks

    tiny = str(build_tiny_qwen2(tmp_path / "model", seed=1))
    ranks = run_ranks(tr.nonfinite_scenario, 2, tiny, str(tmp_path), timeout_s=300)
    skipped = sum(r["bad"][0]["skipped"] == 1.0 and r["bad"][1]["skipped"] == 1.0 for r in ranks)
    change = max(r["max_change"] for r in ranks)
    refused = [r["saves"][w][0] is not None and not r["saves"][w][1] for r in ranks for w in ("param", "optim")]
    if skipped != 2 or change != 0.0 or not all(r["finite"] for r in ranks) or not all(refused):
        pytest.fail(f"skipped on {skipped}/2 ranks, max |dw| {change}, refused saves {refused}")
    nxt = ranks[0]["next"]
    if not (nxt["skipped"] == 0.0 and math.isfinite(nxt["loss"]) and nxt["loss"] == ranks[0]["next_ref"]["loss"]):
        pytest.fail(f"the step after the skipped ones: {nxt} (reference {ranks[0]['next_ref']})")
    if not all(r["saves"]["ok"] == (None, True) for r in ranks):
        pytest.fail("a finite state was not saved")
    guarantee("NaN in one rank's loss skips the step on every rank; no non-finite value reaches a checkpoint",
              f"rank 1 loss NaN (NaN gradients, then a NaN constant) -> skipped on {skipped}/2 ranks, max |Δw| "
              f"{change:g} (params and AdamW state), LR schedule not advanced; next step loss {nxt['loss']:.6f} "
              f"= reference without the bad steps; NaN param / inf exp_avg_sq on rank 1 -> save refused on "
              f"{sum(refused)}/4 (2 ranks x 2 cases), nothing written")
