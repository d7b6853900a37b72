"""Mixture-of-experts models in the FSDP backend on CPU (gloo), against transformers' eager
experts: tiny Qwen3-MoE (8 experts, top-2, ``norm_topk_prob`` both ways) and Qwen2-MoE
(shared expert). One spawn per scenario (module-scoped fixtures); each test checks one
promise on the scenario's results.
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

tm = import_helper(Path(__file__).with_name("moe_scenarios.py"))

TOL = 1e-5
COEF = 0.05  # the scenarios' moe_aux_loss_coef (large enough to move the loss visibly)
CONFIG_COEF = 0.02  # the tiny Qwen3-MoE's router_aux_loss_coef
HAS_KERNEL = importlib.util.find_spec("rlweave_kernel_moe") is not None
KERNELS = {"kernel_auto": "rlweave_kernel_moe.kernel:KERNEL",
           "kernel_reference": f"{tm.__name__}:REFERENCE_KERNEL"} if HAS_KERNEL else {}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_models")
    return {
        "q3": str(build_tiny_qwen3_moe(root / "q3", seed=1, router_aux_loss_coef=CONFIG_COEF)),
        "q3n": str(build_tiny_qwen3_moe(root / "q3n", seed=2, norm_topk_prob=False)),
        "q2": str(build_tiny_qwen2_moe(root / "q2", seed=3)),
    }


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return str(build_tiny_qwen2(tmp_path_factory.mktemp("moe_dense") / "model", seed=1))


@pytest.fixture(scope="module")
def one_rank(models, dense, tmp_path_factory):
    work = str(tmp_path_factory.mktemp("moe_ranks1"))
    return run_ranks(tm.one_rank_scenario, 1, models, work, COEF, KERNELS, dense, timeout_s=600), work


@pytest.fixture(scope="module")
def ranks(models, one_rank, tmp_path_factory):
    """``{1: (results, work dir), 2: (...)}`` of :func:`moe_scenarios.ranks_scenario`."""
    work = str(tmp_path_factory.mktemp("moe_ranks2"))
    two = run_ranks(tm.ranks_scenario, 2, models, work, COEF, timeout_s=600)
    return {1: (one_rank[0]["ranks"], one_rank[1]), 2: (two, work)}


@pytest.fixture(scope="module")
def variants(one_rank):
    return one_rank[0]["variants"]


def eager(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, experts_implementation="eager").eval()


@functools.cache
def reference_logprobs(path: str) -> dict[int, torch.Tensor]:
    m = eager(path)
    return {i: sc.sample_logprobs(m, s, "cpu") for i, s in enumerate(sc.fixed_batch().sequences("input_ids"))}


def maxdiff(a: dict, b: dict) -> float:
    assert set(a) == set(b) and a
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("name", ["q3", "q3n", "q2"])
def test_packed_logprobs_equal_transformers_eager_experts(ranks, models, world, name):
    assert maxdiff(ranks[world][0][name]["logprobs"], reference_logprobs(models[name])) < TOL


@pytest.mark.parametrize("name", ["q3", "q2"])
def test_train_step_equal_on_one_and_two_ranks(ranks, name):
    """The same micro-batches on one rank and on two: loss, load-balancing loss, expert-load
    metrics, full gradients and updated weights agree."""
    one, two = ranks[1][0][name], ranks[2][0][name]
    assert one["metrics"]["num_micro_batches"] == 2 and two["metrics"]["num_micro_batches"] == 1
    for k in ("loss", "nll", "moe_aux_loss", "grad_norm", "moe_load_max_over_mean", "moe_load_min_over_mean",
              "moe_tokens_per_expert_max"):
        assert one["metrics"][k] == pytest.approx(two["metrics"][k], rel=1e-5), k
    assert one["metrics"]["loss"] == pytest.approx(one["metrics"]["nll"] + COEF * one["metrics"]["moe_aux_loss"],
                                                   rel=1e-6)
    assert maxdiff(one["grads"], two["grads"]) < 1e-6
    assert set(one["grads"]) == set(one["state"])  # every parameter got a gradient, routers and experts included
    assert maxdiff(one["state"], two["state"]) < 1e-6


def test_aux_loss_and_its_gradient_are_transformers(variants, models):
    """One sample, one micro-batch, coefficient 1: ``moe_aux_loss`` is transformers'
    ``aux_loss`` of that forward and every gradient (routers included) is that of transformers'
    ``nll + aux_loss``."""
    res = variants["single"]
    m = eager(models["q3"])
    s = sc.fixed_batch().sequences("input_ids")[3]
    b = sc.fixed_batch().select([3])
    w = b.token["loss_mask"] / b.token["loss_mask"].sum()
    out = m(s.view(1, -1), output_router_logits=True)
    lp = torch.log_softmax(out.logits[0, :-1], -1).gather(-1, s[1:].view(-1, 1)).squeeze(-1)
    nll = -(w[1:] * lp).sum()
    (nll + out.aux_loss).backward()
    assert res["metrics"]["moe_aux_loss"] == pytest.approx(float(out.aux_loss.detach()), rel=1e-6)
    assert res["metrics"]["loss"] == pytest.approx(float((nll + out.aux_loss).detach()), rel=1e-6)
    ref = {n: p.grad for n, p in m.named_parameters()}
    norm = float(torch.sqrt(sum((g**2).sum() for g in ref.values())))
    assert res["metrics"]["grad_norm"] == pytest.approx(norm, rel=1e-5)
    clip = min(1.0, tm.OPTIM["grad_clip"] / (norm + 1e-6))  # the captured gradients are clipped ones
    assert set(res["grads"]) == set(ref)
    for n in tm.ROUTERS:
        assert float(ref[n].abs().max()) > 1e-3
    assert maxdiff(res["grads"], {n: g * clip for n, g in ref.items()}) < 1e-6


def test_aux_loss_weight_independent_of_the_micro_batch_split(variants):
    """Three copies of a sample in one micro-batch or in three: each micro-batch weighs its
    share of the step's tokens, so loss, load-balancing loss and gradients are the same."""
    one, three = variants["dup1"], variants["dup3"]
    assert one["metrics"]["num_micro_batches"] == 1 and three["metrics"]["num_micro_batches"] == 3
    for k in ("loss", "moe_aux_loss", "grad_norm", "moe_load_max_over_mean", "moe_load_min_over_mean"):
        assert one["metrics"][k] == pytest.approx(three["metrics"][k], rel=1e-5), k
    assert three["metrics"]["moe_tokens_per_expert_max"] == one["metrics"]["moe_tokens_per_expert_max"]
    assert maxdiff(one["grads"], three["grads"]) < 1e-6


def test_aux_loss_coefficient_default_and_off(variants):
    """``moe_aux_loss_coef``: null takes the model config's ``router_aux_loss_coef``, 0 turns
    the loss off (gradients of the routers then change), the loss adds ``coef * aux``."""
    plain, off, default = variants["plain"], variants["coef0"], variants["default"]
    nll = off["metrics"]["loss"]
    aux = plain["metrics"]["moe_aux_loss"]
    assert off["metrics"]["moe_aux_loss"] == pytest.approx(aux, rel=1e-6)  # reported, not added
    assert plain["metrics"]["loss"] == pytest.approx(nll + COEF * aux, rel=1e-6)
    assert default["metrics"]["loss"] == pytest.approx(nll + CONFIG_COEF * aux, rel=1e-6)
    for n in tm.ROUTERS:
        assert not torch.allclose(plain["grads"][n], off["grads"][n], atol=1e-6)


def test_activation_checkpointing_counts_each_router_once(variants):
    plain, ckpt = variants["plain"], variants["checkpointed"]
    for k in ("loss", "moe_aux_loss", "grad_norm", "moe_load_max_over_mean", "moe_tokens_per_expert_max"):
        assert ckpt["metrics"][k] == pytest.approx(plain["metrics"][k], rel=1e-5), k
    assert maxdiff(plain["grads"], ckpt["grads"]) < 1e-6


def test_padded_rows_route_only_real_tokens(variants):
    plain, padded = variants["plain"], variants["padded"]
    assert float((plain["logprobs"] - padded["logprobs"]).abs().max()) < TOL
    for k in ("loss", "moe_aux_loss", "moe_load_max_over_mean", "moe_load_min_over_mean",
              "moe_tokens_per_expert_max"):
        assert padded["metrics"][k] == pytest.approx(plain["metrics"][k], rel=1e-5), k
    assert maxdiff(plain["grads"], padded["grads"]) < 1e-6


def test_expert_load_metrics_are_sane(variants):
    m = variants["plain"]["metrics"]
    tokens, experts, top_k = 76, 8, 2
    assert 1.0 <= m["moe_load_max_over_mean"] <= experts / top_k
    assert 0.0 <= m["moe_load_min_over_mean"] <= 1.0
    # mean tokens per expert is tokens * top_k / experts; no expert gets a token twice
    assert tokens * top_k / experts <= m["moe_tokens_per_expert_max"] <= tokens
    assert m["moe_aux_loss"] > 0


@pytest.mark.skipif(not HAS_KERNEL, reason="rlweave-kernel-moe is not installed")
@pytest.mark.parametrize("label, impl", [("kernel_auto", "torch"), ("kernel_reference", "reference")])
def test_grouped_experts_kernel_equals_transformers_experts(variants, label, impl):
    """With ``moe_groupgemm`` selected, the experts of both layers are replaced (before
    sharding) and log-probs, loss, load-balancing loss and gradients equal transformers'."""
    plain, k = variants["plain"], variants[label]
    assert plain["kernel"] is None
    assert k["kernel"]["replaced"] == 2 and k["kernel"]["impl"] == impl
    assert float((plain["logprobs"] - k["logprobs"]).abs().max()) < TOL
    for key in ("loss", "moe_aux_loss", "grad_norm"):
        assert k["metrics"][key] == pytest.approx(plain["metrics"][key], rel=1e-5), key
    assert maxdiff(plain["grads"], k["grads"]) < 1e-5


@pytest.mark.skipif(not HAS_KERNEL, reason="rlweave-kernel-moe is not installed")
def test_kernel_on_a_dense_model_replaces_nothing(variants):
    d = variants["dense"]
    assert d["kernel"] is None and "moe_aux_loss" not in d["metrics"]
    assert any("nothing to replace" in line for line in d["logged"])
    assert any("replaced the experts of 2 of 2 MoE layers (implementation torch)" in line
               for line in variants["kernel_auto"]["logged"])


def test_streamed_weights_are_the_checkpoint_layout(ranks, models):
    """``named_weights`` yields what ``save_pretrained`` wrote (per-expert names, equal
    tensors) and, after training, per-expert slices of the stacked parameters."""
    from safetensors.torch import load_file

    saved = load_file(models["q3"] + "/model.safetensors")
    for world in (1, 2):
        res = ranks[world][0]
        assert set(res["streamed0"]) == set(saved)
        for k, v in saved.items():
            assert torch.equal(res["streamed0"][k], v), k
        streamed, state = res["streamed1"], res["q3"]["state"]
        assert not [k for k in streamed if k.endswith(("gate_up_proj", "experts.down_proj"))]
        half = state["model.layers.0.mlp.experts.gate_up_proj"].shape[1] // 2
        for layer in (0, 1):
            p = f"model.layers.{layer}.mlp.experts"
            for e in range(8):
                assert torch.equal(streamed[f"{p}.{e}.gate_proj.weight"], state[f"{p}.gate_up_proj"][e, :half])
                assert torch.equal(streamed[f"{p}.{e}.up_proj.weight"], state[f"{p}.gate_up_proj"][e, half:])
                assert torch.equal(streamed[f"{p}.{e}.down_proj.weight"], state[f"{p}.down_proj"][e])
        assert torch.equal(streamed["model.layers.1.mlp.gate.weight"], state["model.layers.1.mlp.gate.weight"])


@pytest.mark.parametrize("world", [1, 2])
def test_hf_export_reloads_in_transformers_with_identical_logits(ranks, models, world):
    from safetensors import safe_open

    res, work = ranks[world]
    state = res["q3"]["state"]
    with safe_open(work + "/hf/model.safetensors", "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.mlp.experts.7.up_proj.weight" in names
    assert not [k for k in names if "gate_up_proj" in k or k.endswith("experts.down_proj")]
    loaded = eager(work + "/hf")
    assert maxdiff(dict(loaded.state_dict()), state) == 0.0
    trained = eager(models["q3"])
    trained.load_state_dict(state)
    ids = sc.fixed_batch().sequences("input_ids")[3].view(1, -1)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, trained(ids).logits)


@pytest.mark.parametrize("world", [1, 2])
def test_checkpoint_round_trip(ranks, world):
    """A fresh worker that loads the DCP checkpoint (the module's own, stacked names) takes
    the same next step as the worker that saved it."""
    res = ranks[world][0]["q3"]
    a, b = res["next"], res["resumed_next"]
    for k in ("loss", "moe_aux_loss", "grad_norm", "moe_load_max_over_mean"):
        assert a[k] == b[k], k
    assert maxdiff(res["state_next"], res["resumed_state_next"]) == 0.0
    assert "model.layers.0.mlp.experts.gate_up_proj" in res["state_next"]


def test_sequence_parallelism_is_refused_for_moe(ranks):
    err = ranks[2][0]["sp_error"]
    assert "roles.policy.parallel.sp" in err and "8 experts" in err and "not supported yet" in err
