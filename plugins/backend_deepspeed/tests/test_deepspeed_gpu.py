"""The CPU parity run again on one CUDA GPU over NCCL (world size 1): ZeRO-2, ZeRO-3 and ZeRO-3
with optimizer and parameter offload against the FSDP backend on the same GPU, fp32.

Skipped without CUDA or without deepspeed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks
from rlweave.testing.tiny_model import build_tiny_qwen2

pytest.importorskip("deepspeed", reason="deepspeed not installed")
sc = import_helper(Path(__file__).with_name("ds_scenarios.py"))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TOL = 1e-5
VARIANTS = ["zero2", "zero3", "zero3_offload"]


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
    tiny = str(build_tiny_qwen2(tmp_path_factory.mktemp("ds_gpu_tiny") / "model", seed=1))
    return run_ranks(sc.parity_scenario, 1, tiny, VARIANTS, device="cuda", timeout_s=600)


def _maxdiff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_zero_stages_equal_fsdp(parity, variant):
    ref, got = parity["fsdp"], parity[variant]
    assert _maxdiff(got["logprobs"], ref["logprobs"]) <= TOL
    for m, r in zip(got["metrics"], ref["metrics"]):
        assert abs(m["loss"] - r["loss"]) <= TOL * max(1.0, abs(r["loss"]))
        assert abs(m["grad_norm"] - r["grad_norm"]) <= TOL * max(1.0, r["grad_norm"])
    assert _maxdiff(got["weights"], ref["weights"]) <= TOL
