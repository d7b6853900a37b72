"""Mixture-of-experts models in the megatron backend (a tiny Qwen3-MoE, 8 experts, top-2) with
expert parallelism, against the FSDP backend's MoE worker on the same ranks and samples.

Two spawns, shared by the tests: ``ep2`` (2 ranks, ``ep=2``: each rank one data-parallel replica
holding 4 experts, one micro-batch each) and ``ep2dp2`` (4 ranks,
``ep=2``: two expert-parallel groups, the ``moe_groupgemm`` kernel, several micro-batches per
replica). Each returns log-probs, the step's metrics (loss with the router load-balancing loss,
``moe_aux_loss``, expert load, grad norm) and the weights after the step, for both backends, and
their router replay (R2/R3) results: a foreign routing replayed by the log-prob passes (megatron's
packed and right-padded) and a second training step under it with the load-balancing loss
(megatron's with activation recomputation).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks
from rlweave.testing.tiny_model import build_tiny_qwen3_moe

pytestmark = [pytest.mark.xdist_group("megatron_moe"),
              pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")]

ms = import_helper(Path(__file__).with_name("moe_scenarios.py"))
TOL = 1e-5
HAS_KERNEL = importlib.util.find_spec("rlweave_kernel_moe") is not None


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(build_tiny_qwen3_moe(tmp_path_factory.mktemp("mmoe") / "q3", seed=1, router_aux_loss_coef=0.02))


@pytest.fixture(scope="module", params=["ep2", "ep2dp2"])
def run(request, model, tmp_path_factory):
    work = tmp_path_factory.mktemp(request.param)
    if request.param == "ep2":
        res = run_ranks(ms.parity_scenario, 2, model, str(work), {"ep": 2}, 4096, False, 8, True, timeout_s=600)
    else:
        if not HAS_KERNEL:
            pytest.skip("rlweave-kernel-moe not installed")
        res = run_ranks(ms.parity_scenario, 4, model, str(work), {"ep": 2}, 24, True, timeout_s=600)
    return request.param, res, work


def _diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), sorted(set(a) ^ set(b))[:6]
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_expert_parallel_step_equals_fsdp(run, model):
    from safetensors.torch import load_file

    name, res, _ = run
    f, m = res["fsdp"], res["megatron"]
    assert _diff(f["logprobs"], m["logprobs"]) < TOL
    fm, mm = f["metrics"], m["metrics"]
    assert mm["moe_aux_loss"] > 1.0  # the aux loss is there (its minimum, perfect balance, is 1)
    for k in ("loss", "moe_aux_loss", "grad_norm", "tokens"):
        assert abs(fm[k] - mm[k]) < TOL * max(1.0, abs(fm[k])), (k, fm[k], mm[k])
    for k in ("moe_load_max_over_mean", "moe_load_min_over_mean", "moe_tokens_per_expert_max"):
        assert fm[k] == mm[k], (k, fm[k], mm[k])
    if name == "ep2dp2":
        assert mm["num_micro_batches"] > 1
    # the updated weights (every expert, in HF names) equal FSDP's: the gradients were the same
    assert _diff(f["weights"], m["weights"]) < TOL
    before = {}
    for path in sorted(Path(model).glob("*.safetensors")):
        before.update(load_file(str(path)))
    assert _diff(before, m["weights"]) > 1e-3  # the step moved them
    assert any(".mlp.experts.7.down_proj.weight" in k for k in m["weights"])


def test_each_rank_holds_its_share_of_the_experts(run):
    _, res, _ = run
    counts = res["param_counts"]
    total = 2 * 8 * (2 * 32 * 64 + 64 * 32)  # layers x experts x (gate_up + down) of the tiny model
    assert all(c["experts"] * 2 == total for c in counts)
    assert [c["ep_rank"] for c in counts] == [r % 2 for r in range(len(counts))]
    assert len({c["rest"] for c in counts}) == 1  # the dense part is replicated


def test_checkpoint_and_export_load_in_other_layouts(run, model, tmp_path):
    """The expert-parallel checkpoint loads into one rank (ep=1) with the weights after the step;
    the HF export holds the same tensors and loads into transformers with nothing missing."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    name, res, work = run
    if name != "ep2dp2":
        pytest.skip("one layout change is enough: the 4-rank run's checkpoint")
    one = run_ranks(ms.reload_scenario, 1, model, str(work / "ckpt"), {}, timeout_s=600)
    assert one["step"] == 1
    assert _diff(one["weights"], res["megatron"]["weights"]) == 0.0
    hf = {}
    for f in sorted((work / "hf").glob("*.safetensors")):
        hf.update(load_file(str(f)))
    assert _diff(hf, res["megatron"]["weights"]) == 0.0
    loaded, info = AutoModelForCausalLM.from_pretrained(str(work / "hf"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert loaded.config.model_type == "qwen3_moe"


def _cat(by_sample: dict):
    return torch.cat([by_sample[i] for i in sorted(by_sample)])


@pytest.mark.parametrize("passes", ["fsdp_replay", "megatron_replay", "megatron_replay_padded"])
def test_replayed_routing_is_the_routing_used_on_every_token(run, passes):
    """A routing sharing no expert with the router's own on any token is exactly what the pass
    used (100% of tokens, every layer, both experts), it changes the log-probs, and a pass after it
    without routing equals the first (nothing left set)."""
    r = run[1][passes]
    own, given = _cat(r["own"]), _cat(r["given"])
    assert own.dtype == torch.int16 and own.shape[1:] == (2, 2)  # (tokens, layers, top-k)
    assert not (own.unsqueeze(-1) == given.unsqueeze(-2)).any()  # the router would choose none of them
    assert torch.equal(_cat(r["chosen"]), given)
    assert not torch.allclose(_cat(r["lp_replay"]), _cat(r["lp_own"]), atol=1e-3)
    assert torch.equal(_cat(r["lp_again"]), _cat(r["lp_own"]))


def test_megatron_replay_equals_fsdp_replay(run):
    """Same model, same routing: megatron's recorded and replayed routing and log-probs (packed and
    right-padded rows, the replayed experts through the expert-parallel exchange) equal FSDP's."""
    res = run[1]
    f = res["fsdp_replay"]
    for name in ("megatron_replay", "megatron_replay_padded"):
        m = res[name]
        assert torch.equal(_cat(m["own"]), _cat(f["own"])), name
        assert _diff(m["lp_own"], f["lp_own"]) < TOL, name
        assert _diff(m["lp_replay"], f["lp_replay"]) < TOL, name


def test_a_training_step_replays_and_the_router_gets_its_gradient(run):
    """A step under the foreign routing with the load-balancing loss: the training forward equals
    the replayed no-grad pass, the routers get a gradient (through the replayed experts' weights
    and the aux loss) and the step equals FSDP's: loss, ``moe_aux_loss``, grad norm,
    ``moe_replay_changed_frac`` and the routers' gradients (megatron's with activation
    recomputation, on right-padded rows in the 2-rank run: the recomputed forward in backward
    replays too and carries the aux loss's gradient of the real tokens alone)."""
    res = run[1]
    f, m = res["fsdp_replay_step"], res["megatron_replay_step"]
    for r in (f, m):
        assert abs(r["wlp_train"] - r["wlp_pass"]) < TOL, (r["wlp_train"], r["wlp_pass"])
        assert all(float(g.abs().sum()) > 0 for g in r["router_grads"])
        # a routing chosen before the first step: after it, nearly all replayed decisions still differ
        assert 0.9 < r["metrics"]["moe_replay_changed_frac"] <= 1.0
    assert m["metrics"]["moe_aux_loss"] > 1.0  # the aux loss is in this step (its minimum is 1)
    for k in ("loss", "moe_aux_loss", "grad_norm", "moe_replay_changed_frac"):
        assert abs(f["metrics"][k] - m["metrics"][k]) < TOL * max(1.0, abs(f["metrics"][k])), \
            (k, f["metrics"][k], m["metrics"][k])
    for gf, gm in zip(f["router_grads"], m["router_grads"]):
        assert float((gf - gm).abs().max()) < TOL
