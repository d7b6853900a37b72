"""The CPU comparisons again on one CUDA GPU over NCCL (world size 1, TP=1, fp32): log-probs
and entropy equal transformers on the same GPU, and one train step equals the FSDP backend's on
the GPU. Skipped without CUDA or megatron-core. Two-GPU cases (TP=2, PP=2 over NCCL) need a
second GPU and are not here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core not installed")

from rlweave.testing import scenarios as sc  # noqa: E402
from rlweave.testing.helper_modules import import_helper  # noqa: E402
from rlweave.testing.ranks import run_ranks  # noqa: E402

mt = import_helper(Path(__file__).with_name("megatron_scenarios.py"))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TOL = 1e-4  # fp32 on a GPU: the two backends' kernels sum in different orders


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from rlweave.testing.tiny_model import build_tiny_qwen2

    root = tmp_path_factory.mktemp("megatron_gpu")
    d = str(build_tiny_qwen2(root / "m", layers=4, seed=2))
    got = run_ranks(mt.policy_scenario, 1, d, str(root), {}, device="cuda", timeout_s=600)
    ref = run_ranks(mt.fsdp_policy, 1, d, device="cuda", timeout_s=600)
    return d, got, ref


def test_logprobs_equal_transformers_on_the_gpu(runs):
    d, got, _ = runs
    ref = sc.reference_logprobs(d, device="cuda")
    for i, lp in ref.items():
        assert torch.allclose(got["logprobs"][i], lp, atol=TOL, rtol=0), i


def test_train_step_equals_fsdp_on_the_gpu(runs):
    _, got, ref = runs
    for key in ("loss", "grad_norm"):
        assert abs(got["metrics"][key] - ref["metrics"][key]) < TOL * max(1.0, abs(ref["metrics"][key])), key
    for name, w in ref["weights"].items():
        assert (got["weights"][name] - w).abs().max().item() < TOL, name


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    from rlweave.testing.tiny_model import build_tiny_qwen3_moe

    ms = import_helper(Path(__file__).with_name("moe_scenarios.py"))
    root = tmp_path_factory.mktemp("megatron_moe_gpu")
    d = str(build_tiny_qwen3_moe(root / "q3", seed=1, router_aux_loss_coef=0.02))
    return run_ranks(ms.parity_scenario, 1, d, str(root), {}, 4096, True, device="cuda", timeout_s=600)


def test_moe_train_step_equals_fsdp_on_the_gpu(moe_run):
    """A tiny Qwen3-MoE (ep=1, the grouped-matmul kernel on CUDA) against the FSDP backend's MoE worker."""
    f, m = moe_run["fsdp"], moe_run["megatron"]
    for i, lp in f["logprobs"].items():
        assert torch.allclose(m["logprobs"][i], lp, atol=TOL, rtol=0), i
    for key in ("loss", "moe_aux_loss", "grad_norm"):
        assert abs(m["metrics"][key] - f["metrics"][key]) < TOL * max(1.0, abs(f["metrics"][key])), key
    for name, w in f["weights"].items():
        assert (m["weights"][name] - w).abs().max().item() < TOL, name
