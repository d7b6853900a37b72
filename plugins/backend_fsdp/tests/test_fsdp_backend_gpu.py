"""The CPU scenarios again on one CUDA GPU over NCCL (world size 1), plus measured offload.

Skipped without CUDA. fp32 with TF32 off, so the 1e-5 tolerances of the CPU tests hold.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks
from rlweave.testing.tiny_model import build_tiny_qwen2

sc = import_helper(Path(__file__).with_name("fsdp_scenarios.py"))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TOL = 1e-5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_qwen2(tmp_path_factory.mktemp("fsdp_gpu_tiny") / "model", seed=1))


@pytest.fixture(scope="module")
def policy(tiny, tmp_path_factory):
    work = str(tmp_path_factory.mktemp("fsdp_gpu_policy"))
    return run_ranks(sc.policy_scenario, 1, tiny, work, device="cuda", timeout_s=600), work


@pytest.fixture(scope="module")
def heads(tiny, tmp_path_factory):
    work = str(tmp_path_factory.mktemp("fsdp_gpu_heads"))
    return run_ranks(sc.heads_scenario, 1, tiny, work, device="cuda", timeout_s=600), work


def _maxdiff(a: dict, b: dict) -> float:
    assert set(a) == set(b) == set(range(6))
    return max(float((a[i] - b[i]).abs().max()) for i in a)


def test_gpu_logprobs_packed_padded_reference(policy, tiny):
    res, _ = policy
    assert _maxdiff(res["logprobs"], sc.reference_logprobs(tiny, "cuda")) < TOL
    assert _maxdiff(res["logprobs"], res["logprobs_padded"]) < TOL


def test_gpu_streamed_weights_equal_state_dict(policy, tiny):
    from transformers import AutoModelForCausalLM

    res, _ = policy
    sd = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).state_dict()
    assert set(res["streamed0"]) == set(sd)
    assert all(torch.equal(res["streamed0"][k], v) for k, v in sd.items())


def test_gpu_training_gradient_and_resume(policy, tiny):
    res, _ = policy
    losses = [m["loss"] for m in res["metrics"]]
    assert losses[-1] < losses[0] - 0.5
    loss, norm = sc.reference_grad_norm(tiny)
    assert res["metrics"][0]["loss"] == pytest.approx(loss, rel=1e-5)
    assert res["metrics"][0]["grad_norm"] == pytest.approx(norm, rel=1e-4)
    for a, b in zip(res["metrics"][2:], res["metrics_resumed"]):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)


def test_gpu_hf_export_and_offload(policy):
    res, work = policy
    assert _maxdiff(res["logprobs_after"], sc.reference_logprobs(work + "/hf", "cuda")) < TOL
    off = res["offload"]
    assert off["device"] == "cuda" and off["freed_bytes"] >= 0.9 * (off["param_bytes"] + off["optim_bytes"]) > 0
    assert res["onload"]["loaded_bytes"] >= off["param_bytes"]
    assert _maxdiff(res["logprobs_onload"], res["logprobs_after"]) == 0.0


def test_gpu_reward_and_critic(heads):
    res, _ = heads
    assert _maxdiff(res["critic_last"], res["scores"]) < TOL
    vl = [m["vloss"] for m in res["critic_metrics"]]
    assert vl[-1] < vl[0]


def test_gpu_compiled_layers_equal_eager(tiny, tmp_path):
    res = run_ranks(sc.compile_scenario, 1, tiny, str(tmp_path), device="cuda", timeout_s=600)
    eager, comp = res[False], res[True]
    assert comp["compiled"] == ["Qwen2DecoderLayer"] * 2 and comp["graphs"] > 0  # auto on CUDA: whole layers
    for k in ("lp_packed", "lp_shared"):
        assert float((eager[k] - comp[k]).abs().max()) < 1e-4, k
    assert comp["losses"] == pytest.approx(eager["losses"], abs=1e-4)
