"""An FSDP checkpoint (DCP) saved by 2 ranks loads on 1 rank with bitwise-equal parameters,
AdamW state and LR schedule, and the next training step gives the same loss (CPU, gloo).
Scenario: ``plugins/backend_fsdp/tests/reliability_scenarios.py``; the reverse direction
(1 -> 2) is in ``plugins/backend_fsdp/tests/test_fsdp_reliability_cpu.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlweave.testing.helper_modules import import_helper

pytest.importorskip("rlweave_backend_fsdp")
tr = import_helper(Path(__file__).parents[2] / "plugins/backend_fsdp/tests/reliability_scenarios.py")


def test_two_rank_checkpoint_reloads_bitwise_on_one_rank(guarantee, tmp_path):
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave.testing.ranks import run_ranks

    tiny = str(build_tiny_qwen2(tmp_path / "model", seed=1))
    ckpt = str(tmp_path / "ckpt")
    saved = run_ranks(tr.reshard_scenario, 2, tiny, None, ckpt, timeout_s=300)
    loaded = run_ranks(tr.reshard_scenario, 1, tiny, ckpt, None, timeout_s=300)
    a, b = saved["state"]["tensors"], loaded["state"]["tensors"]
    if set(a) != set(b):
        pytest.fail(f"different state keys: {sorted(set(a) ^ set(b))[:5]}")
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    n_optim = sum(k.startswith("optim/") for k in a)
    if unequal or n_optim == 0 or saved["state"]["scheduler"] != loaded["state"]["scheduler"]:
        pytest.fail(f"not bitwise equal after 2 -> 1: {unequal[:5]} (optimizer tensors: {n_optim})")
    la, lb = saved["next"]["loss"], loaded["next"]["loss"]
    if abs(la - lb) > 1e-6 * abs(la):
        pytest.fail(f"next-step loss {lb} on 1 rank vs {la} on 2 ranks")
    guarantee("an FSDP checkpoint saved by 2 ranks reloads on 1 rank unchanged",
              f"{len(a) - n_optim} parameters + {n_optim} AdamW state tensors bitwise equal, LR schedule equal; "
              f"next-step loss {lb:.7f} (1 rank) vs {la:.7f} (2 ranks), |Δ| {abs(la - lb):.1e}")
