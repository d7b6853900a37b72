"""DeepSpeed backend on CPU with 2 ranks over gloo, against the FSDP backend on the same ranks.

One spawn (a module-scoped fixture) compares FSDP with ZeRO 1/2/3, ZeRO-3 with activation
checkpointing, the two offload settings and bf16. The non-finite skip and the checkpoint reload
at another world size and ZeRO stage are the backend contract's (test_deepspeed_contract.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks
from rlweave.testing.tiny_model import build_tiny_qwen2

sc = import_helper(Path(__file__).with_name("ds_scenarios.py"))
pytestmark = pytest.mark.xdist_group("deepspeed_cpu")

TOL = 1e-5
VARIANTS = list(sc.VARIANTS)
EXACT = [v for v in VARIANTS if "bf16" not in v]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_qwen2(tmp_path_factory.mktemp("ds_tiny") / "model", seed=1))


@pytest.fixture(scope="module")
def parity(tiny):
    return run_ranks(sc.parity_scenario, 2, tiny, VARIANTS, timeout_s=600)


def _maxdiff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("variant", EXACT)
def test_zero_stages_and_offload_equal_fsdp(parity, variant):
    ref, got = parity["fsdp"], parity[variant]
    assert _maxdiff(got["logprobs"], ref["logprobs"]) <= TOL
    for m, r in zip(got["metrics"], ref["metrics"]):
        assert m["skipped"] == 0.0
        assert abs(m["loss"] - r["loss"]) <= TOL * max(1.0, abs(r["loss"]))
        assert abs(m["grad_norm"] - r["grad_norm"]) <= TOL * max(1.0, r["grad_norm"])
        assert m["lr"] == pytest.approx(r["lr"])
    # the grad norm is above optim.grad_clip (1.0): both clipped, and the updates agree
    assert ref["metrics"][0]["grad_norm"] > 1.0
    assert _maxdiff(got["weights"], ref["weights"]) <= TOL
    assert _maxdiff(got["logprobs_after"], ref["logprobs_after"]) <= TOL


def test_zero3_stream_holds_one_gathered_parameter_at_a_time(parity):
    for report in parity["zero3"]["streams"]:  # every rank, measured while streaming
        assert 0 < report["peak_gathered"] <= report["largest"]


def test_bf16_computes_in_bf16_with_fp32_master_weights(parity):
    ref, got = parity["fsdp"], parity["zero2_bf16"]
    assert {t.dtype for t in got["weights"].values()} == {torch.bfloat16}  # what the model computes with
    assert got["master_dtypes"] == ["torch.float32"]
    diff = _maxdiff(got["logprobs"], ref["logprobs"])
    assert 0 < diff < 0.1  # bf16 rounding: close to fp32, not identical
    assert all(m["skipped"] == 0.0 for m in got["metrics"])
    assert got["metrics"][1]["loss"] < got["metrics"][0]["loss"]
