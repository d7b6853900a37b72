"""The MoE scenarios on one CUDA GPU (NCCL, world size 1): log-probs against transformers'
eager experts, the load-balancing loss, export and checkpoint names, and the
``moe_groupgemm`` kernel (its CUDA pick, torch's grouped_mm; Triton; the reference) inside the
FSDP worker.

Skipped without CUDA. fp32 with TF32 off, so the CPU tests' tolerances hold for
transformers' own experts; the grouped (torch, Triton) experts with a tolerance of their own.
The kernel package is imported directly (``rlweave_kernel_moe`` on the path), not through
entry points.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest
import torch

from rlweave.testing import scenarios as sc
from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks
from rlweave.testing.tiny_model import build_tiny_qwen2, build_tiny_qwen2_moe, build_tiny_qwen3_moe

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

tm = import_helper(Path(__file__).with_name("moe_scenarios.py"))

TOL = 1e-5
TRITON_TOL = 1e-4
COEF = 0.05
HAS_KERNEL = importlib.util.find_spec("rlweave_kernel_moe") is not None
KERNELS = {"kernel_auto": "rlweave_kernel_moe.kernel:KERNEL",
           "kernel_triton": f"{tm.__name__}:TRITON_KERNEL",
           "kernel_reference": f"{tm.__name__}:REFERENCE_KERNEL"} if HAS_KERNEL else {}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_gpu_models")
    return {"q3": str(build_tiny_qwen3_moe(root / "q3", seed=1)),
            "q3n": str(build_tiny_qwen3_moe(root / "q3n", seed=2, norm_topk_prob=False)),
            "q2": str(build_tiny_qwen2_moe(root / "q2", seed=3))}


@pytest.fixture(scope="module")
def run(models, tmp_path_factory):
    dense = str(build_tiny_qwen2(tmp_path_factory.mktemp("moe_gpu_dense") / "model", seed=1))
    work = str(tmp_path_factory.mktemp("moe_gpu_work"))
    res = run_ranks(tm.one_rank_scenario, 1, models, work, COEF, KERNELS, dense, device="cuda", timeout_s=600)
    return res, work


@functools.cache
def reference_logprobs(path: str) -> dict[int, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, experts_implementation="eager").cuda().eval()
    return {i: sc.sample_logprobs(m, s, "cuda") for i, s in enumerate(sc.fixed_batch().sequences("input_ids"))}


def maxdiff(a: dict, b: dict) -> float:
    assert set(a) == set(b) and a
    return max(float((a[k].cpu() - b[k].cpu()).abs().max()) for k in a)


@pytest.mark.parametrize("name", ["q3", "q3n", "q2"])
def test_gpu_moe_logprobs_equal_transformers_eager_experts(run, models, name):
    assert maxdiff(run[0]["ranks"][name]["logprobs"], reference_logprobs(models[name])) < TOL


def test_gpu_moe_train_step_metrics_and_checkpoint(run):
    res = run[0]["ranks"]["q3"]
    m = res["metrics"]
    assert m["loss"] == pytest.approx(m["nll"] + COEF * m["moe_aux_loss"], rel=1e-5)
    assert 1.0 <= m["moe_load_max_over_mean"] <= 4.0 and 0.0 <= m["moe_load_min_over_mean"] <= 1.0
    assert set(res["grads"]) == set(res["state"])
    assert res["next"]["loss"] == res["resumed_next"]["loss"]
    assert maxdiff(res["state_next"], res["resumed_state_next"]) == 0.0


def test_gpu_moe_variants(run):
    v = run[0]["variants"]
    for label in ("checkpointed", "padded"):
        assert v[label]["metrics"]["moe_aux_loss"] == pytest.approx(v["plain"]["metrics"]["moe_aux_loss"], rel=1e-5)
        assert maxdiff(v["plain"]["grads"], v[label]["grads"]) < 1e-5, label
    assert v["dup1"]["metrics"]["loss"] == pytest.approx(v["dup3"]["metrics"]["loss"], rel=1e-5)


def test_gpu_moe_export_is_checkpoint_layout(run, models):
    from safetensors.torch import load_file

    res, work = run
    saved = load_file(models["q3"] + "/model.safetensors")
    streamed = res["ranks"]["streamed0"]
    assert set(streamed) == set(saved) and all(torch.equal(streamed[k], v) for k, v in saved.items())
    exported = load_file(work + "/hf/model.safetensors")
    assert set(exported) == set(saved)


@pytest.mark.skipif(not HAS_KERNEL, reason="rlweave-kernel-moe is not on the path")
@pytest.mark.parametrize("label, impl, tol", [("kernel_auto", "torch", TRITON_TOL),  # grouped_mm on CUDA
                                              ("kernel_triton", "triton", TRITON_TOL),
                                              ("kernel_reference", "reference", TOL)])
def test_gpu_grouped_experts_kernel_in_the_worker(run, label, impl, tol):
    v = run[0]["variants"]
    plain, k = v["plain"], v[label]
    assert k["kernel"]["replaced"] == 2 and k["kernel"]["impl"] == impl
    assert float((plain["logprobs"] - k["logprobs"]).abs().max()) < tol
    assert k["metrics"]["loss"] == pytest.approx(plain["metrics"]["loss"], rel=tol)
    assert maxdiff(plain["grads"], k["grads"]) < 10 * tol
