"""The megatron backend on CPU ranks over gloo, fp32, against transformers and the FSDP backend.

A tiny Qwen2 (4 layers, 4 query heads, 2 key/value heads) at DP=2 (TP=1; the optimizer state
sharded over the two replicas, each holding about half), TP=2 x PP=2 (with tied embeddings, whose
copy on the last stage shares its gradient with the embedding) and PP=2 x DP=2 (four ranks, tied:
the embedding and its last-stage copy owned by the same data-parallel rank), TP=2 with
sequence parallelism (norms on half the sequence each, their gradients summed), and a
tiny Qwen3 at TP=2 (log-probs, one step against FSDP, export):

* log-probs and entropy equal transformers' within 1e-5;
* one train step (token-weighted NLL, AdamW, clipping) gives the FSDP backend's loss, gradient
  norm and updated weights within 1e-5, and the weights did move;
* the exported HF directory holds the streamed weights, loads in transformers and scores as the
  trained worker does; while streaming, no rank held more than one gathered tensor (and its
  HF pieces) beyond its own shards (also at TP=2, in the TP=2 checkpoint run);
* value and reward heads at TP=2 equal their FSDP counterparts (streamed weights, and a value
  step's loss, gradient norm and weights);
* a checkpoint resumes with equal weights and optimizer state, also at another TP/PP/DP layout
  (a sharded optimizer's state too);
* at PP=2 the 1F1B pipeline schedule gives the sequential schedule's gradients, and packed
  micro-batches (the default, used by every comparison above) right-padded rows' gradients.

TP=2 alone is the backend contract's layout (``test_megatron_contract.py``: log-probs, entropy,
one train step, HF export against transformers and plain torch), so it is not repeated here.
The FSDP references run in one spawn, the TP=2 heads (with and without SP) in another.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install rlweave-backend-megatron[megatron])")

from rlweave.testing import scenarios as sc
from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks

mt = import_helper(Path(__file__).with_name("megatron_scenarios.py"))

TOL = 1e-5
#: PP=2 runs in the four-rank cases (with TP=2, with DP=2), the 1F1B schedule test and the pp2-tp2 checkpoint test
CASES = {"dp2": ({"dp": 2}, False), "tp2pp2": ({"tp": 2, "pp": 2}, True),
         "pp2dp2": ({"pp": 2, "dp": 2}, True), "tp2sp": ({"tp": 2}, False)}
#: backend options of a case beyond the parallel sizes
CASE_OPTIONS = {"tp2sp": {"sequence_parallel": True}}
HEAD_KINDS = ("value", "reward")


def _world(parallel: dict) -> int:
    """Ranks of a layout: tensor- times pipeline- times data-parallel size."""
    return parallel.get("tp", 1) * parallel.get("pp", 1) * parallel.get("dp", 1)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from rlweave.testing.tiny_model import build_tiny_qwen2

    root = tmp_path_factory.mktemp("megatron_models")
    return {tied: str(build_tiny_qwen2(root / f"tied{tied}", layers=4, tie_word_embeddings=tied, seed=2))
            for tied in (False, True)}


@pytest.fixture(scope="module")
def heads_model(tmp_path_factory):
    """A value/reward model: a tiny Qwen2 without ``lm_head`` and with a one-label ``score.weight``."""
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from safetensors.torch import load_file, save_file

    d = build_tiny_qwen2(tmp_path_factory.mktemp("megatron_heads") / "m", layers=2, seed=5)
    tensors = load_file(str(d / "model.safetensors"))
    tensors.pop("lm_head.weight")
    tensors["score.weight"] = torch.randn(1, 64, generator=torch.Generator().manual_seed(1)) * 0.3
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return str(d)


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory):
    """A tiny Qwen3: query/key norms, head_dim 24 unlike hidden / heads."""
    from rlweave.testing.tiny_model import build_tiny

    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
           "intermediate_size": 128, "max_position_embeddings": 2048, "tie_word_embeddings": False}
    return str(build_tiny("Qwen3", cfg, tmp_path_factory.mktemp("megatron_qwen3") / "m", seed=7))


@pytest.fixture(scope="module")
def fsdp(models, heads_model, qwen3_model):
    """The FSDP references of every comparison, in one spawn: the causal LMs (``tied``,
    ``untied``, ``qwen3``) after one NLL step, the heads model as ``value`` (one step) and ``reward``."""
    runs = {("tied" if tied else "untied"): (d, "causal_lm") for tied, d in models.items()}
    runs["qwen3"] = (qwen3_model, "causal_lm")
    runs.update({kind: (heads_model, kind) for kind in HEAD_KINDS})
    return run_ranks(mt.fsdp_references, 1, runs)


@pytest.fixture(scope="module")
def heads_runs(heads_model):
    """The heads model as ``value`` and ``reward`` at TP=2, without and with sequence
    parallelism (the scalar head gathers the sequence), all in one spawn."""
    return run_ranks(mt.heads_scenario, 2, heads_model, list(HEAD_KINDS), {"tp": 2},
                     [{"sequence_parallel": False}, {"sequence_parallel": True}])


@pytest.fixture(params=[0, 1], ids=["tp2", "tp2sp"])
def heads(request, heads_runs):
    return heads_runs[request.param]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, models, tmp_path_factory):
    parallel, tied = CASES[request.param]
    work = tmp_path_factory.mktemp(f"megatron_{request.param}")
    res = run_ranks(mt.policy_scenario, _world(parallel), models[tied], str(work), parallel, 64, True,
                    CASE_OPTIONS.get(request.param))
    return {"name": request.param, "tied": tied, "dir": models[tied], "work": work, "res": res}


@pytest.fixture(scope="module")
def qwen3(qwen3_model, fsdp, tmp_path_factory):
    """The tiny Qwen3 at TP=2 (its step, weights and HF export, in one spawn) and its FSDP reference."""
    root = tmp_path_factory.mktemp("megatron_qwen3_tp2")
    res = run_ranks(mt.policy_scenario, 2, qwen3_model, str(root), {"tp": 2})
    return {"dir": qwen3_model, "work": root, "res": res, "ref": fsdp["qwen3"]}


def _reference(model_dir: str, weights_dir: str | None = None):
    """Per-sample log-probs and entropies of the fixed batch under transformers."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(weights_dir or model_dir, dtype=torch.float32).eval()
    lps, ents = {}, {}
    with torch.no_grad():
        for i, s in enumerate(sc.fixed_batch().sequences("input_ids")):
            logits = m(s.view(1, -1)).logits[0].float()
            logp = torch.log_softmax(logits[:-1], -1)
            lps[i] = torch.cat([torch.zeros(1), logp.gather(-1, s[1:].view(-1, 1)).squeeze(-1)])
            ents[i] = torch.cat([torch.zeros(1), -(logp.exp() * logp).sum(-1)])
    return lps, ents


def test_logprobs_and_entropy_equal_transformers(case):
    lps, ents = _reference(case["dir"])
    res = case["res"]
    for i in lps:
        assert torch.allclose(res["logprobs"][i], lps[i], atol=TOL, rtol=0), (case["name"], i)
        assert torch.allclose(res["entropy"][i], ents[i], atol=TOL, rtol=0), (case["name"], i)


def test_data_parallel_ranks_hold_half_the_optimizer_state(case):
    """dp=2 shards AdamW's state (ZeRO-1): each rank holds about half of it, all of it together
    (per stage with pp=2); the weights after the step equal FSDP's (``test_train_step_equals_fsdp``)."""
    res = case["res"]
    state, params = res["optim_state_numel"], res["param_numel"]
    if case["name"] == "dp2":
        full = 2 * params[0]  # exp_avg and exp_avg_sq; both replicas hold the same parameters
        assert sum(state) == full
        assert all(0.3 * full <= n <= 0.7 * full for n in state), state
    elif case["name"] == "pp2dp2":  # ranks: stage 0 and 1 of replica 0, then of replica 1
        for stage in (0, 1):
            assert state[stage] + state[stage + 2] == 2 * params[stage]
            assert 0 < state[stage + 2] < 2 * params[stage]
    else:  # every parameter of the rank
        assert state == [2 * n for n in params]


def test_train_step_equals_fsdp(case, fsdp):
    ref = fsdp["tied" if case["tied"] else "untied"]
    got = case["res"]
    for key in ("loss", "grad_norm", "tokens", "nll"):
        assert abs(got["metrics"][key] - ref["metrics"][key]) < TOL * max(1.0, abs(ref["metrics"][key])), key
    assert got["metrics"]["skipped"] == 0.0
    assert set(got["weights"]) == set(ref["weights"])
    from rlweave.backend_helpers.hf_dir import HFReader

    moved = 0.0
    with HFReader(case["dir"]) as before:
        for name, w in ref["weights"].items():
            assert got["weights"][name].shape == w.shape, name
            assert (got["weights"][name] - w).abs().max().item() < TOL, name
            moved = max(moved, (w - before(name)).abs().max().item())
    assert moved > 1e-3  # the step changed the weights, so the comparison means something


def test_exported_hf_directory_loads_and_scores_like_the_worker(case):
    from rlweave.backend_helpers.hf_dir import HFReader

    out = case["work"] / "hf"
    with HFReader(out) as read:
        for name, t in case["res"]["weights"].items():
            assert torch.equal(read(name), t), name
        if case["tied"]:
            assert read("lm_head.weight") is None
    lps, _ = _reference(case["dir"], str(out))
    for i, lp in case["res"]["logprobs_after"].items():
        assert torch.allclose(lp, lps[i], atol=TOL, rtol=0), i


def _streamed_one_gathered_tensor_at_a_time(res: dict) -> None:
    largest = max(t.numel() * t.element_size() for t in res["weights"].values())
    total = sum(t.numel() * t.element_size() for t in res["weights"].values())
    # a full megatron tensor is at most two HF tensors (gate and up); held with its shards or its HF pieces
    assert max(res["stream_peak_bytes"]) > 0
    for peak in res["stream_peak_bytes"]:
        assert peak <= 2 * 2 * largest and peak < total / 2


def test_streaming_holds_one_gathered_tensor_at_a_time(case):
    _streamed_one_gathered_tensor_at_a_time(case["res"])


def test_streaming_at_tp2_holds_one_gathered_tensor_at_a_time(checkpoints):
    """The same at TP=2, where each full tensor is gathered from two ranks' shards (the weights
    the TP=2 checkpoint run streamed after its second step)."""
    _streamed_one_gathered_tensor_at_a_time(checkpoints({"tp": 2})[1])


@pytest.mark.parametrize("kind", HEAD_KINDS)
def test_heads_equal_fsdp(kind, heads, fsdp):
    ref, got = fsdp[kind], heads[kind]
    key = "values" if kind == "value" else "scores"
    assert got[key].abs().max() > 1e-2
    assert torch.allclose(got[key], ref[key], atol=TOL, rtol=0)
    if kind == "value":
        assert abs(got["metrics"]["loss"] - ref["metrics"]["loss"]) < TOL
        assert abs(got["metrics"]["grad_norm"] - ref["metrics"]["grad_norm"]) < TOL * ref["metrics"]["grad_norm"]
    assert set(got["weights"]) == set(ref["weights"])
    for name, w in ref["weights"].items():
        assert (got["weights"][name] - w).abs().max().item() < TOL, name


@pytest.fixture(scope="module")
def checkpoints(models, tmp_path_factory):
    """``checkpoints(parallel)`` -> ``(checkpoint dir, result)`` of the saving run of
    ``mt.resume_scenario`` in that layout, made once per layout for the module."""
    made: dict[tuple, tuple[str, dict]] = {}

    def get(parallel: dict) -> tuple[str, dict]:
        key = tuple(sorted(parallel.items()))
        if key not in made:
            ckpt = str(tmp_path_factory.mktemp("megatron_ckpt") / "ckpt")
            made[key] = ckpt, run_ranks(mt.resume_scenario, _world(parallel), models[True], ckpt, parallel, True)
        return made[key]

    return get


@pytest.mark.parametrize("saved,loaded,options", [
    ({"tp": 2}, {"tp": 2}, {}), ({"tp": 2}, {}, {}), ({"pp": 2}, {"tp": 2}, {}), ({"dp": 2}, {"pp": 2}, {}),
    ({"dp": 2}, {"dp": 2}, {"shard_optimizer": False})],
    ids=["tp2-tp2", "tp2-tp1", "pp2-tp2", "dp2-pp2", "dp2-dp2-unsharded"])
def test_checkpoint_resumes_equal_in_any_layout(saved, loaded, options, models, checkpoints):
    """A checkpoint loads into another layout (``options``: the loading run's), and its next step
    equals the saving run's: dp2-pp2 reads a sharded optimizer's state into one replica,
    dp2-dp2-unsharded into replicas that each keep all of it (gradients all-reduced in buckets)."""
    ckpt, a = checkpoints(saved)  # loading leaves the checkpoint as it was: two layouts read one
    b = run_ranks(mt.resume_scenario, _world(loaded), models[True], ckpt, loaded, False, options)
    assert a["step"] == b["step"] == 1
    for key in ("loss", "grad_norm"):
        assert abs(a["metrics"][key] - b["metrics"][key]) < TOL, key
    assert torch.allclose(a["logprobs"], b["logprobs"], atol=TOL, rtol=0)
    for name, w in a["weights"].items():
        assert (b["weights"][name] - w).abs().max().item() < TOL, name
    from rlweave.backend_helpers.hf_dir import HFReader

    with HFReader(models[True]) as files:  # the saving layout's steps moved the weights: equal means something
        assert max((w - files(name)).abs().max().item() for name, w in a["weights"].items()) > 1e-3


def test_one_forward_one_backward_schedule_equals_sequential(models):
    """pp=2: the 1F1B schedule's gradients (every parameter, both stages) and loss equal the
    sequential schedule's within 1e-6, with 4 and 8 micro-batches (the first stage holding two
    micro-batches in flight, the last one); packed micro-batches equal right-padded rows within 1e-5."""
    res = run_ranks(mt.schedule_scenario, 2, models[True], {"pp": 2}, [4, 8])
    for n in (4, 8):
        for rank in res[n]:
            assert rank["same_params"], rank
            assert rank["grad_diff"] <= 1e-6, (n, rank)
            assert rank["loss_diff"] <= 1e-6, (n, rank)
            assert rank["padded_grad_diff"] <= TOL, (n, rank)
            assert rank["padded_loss_diff"] <= TOL, (n, rank)
        assert res[n][1]["loss"] > 0  # the last stage computed a real loss


def test_qwen3_at_tp2_equals_transformers_and_fsdp(qwen3):
    """Qwen3's query/key norms at TP=2: log-probs and entropy equal transformers'; one train step
    equals the FSDP backend's (loss, gradient norm, every weight, the norms included: their
    gradients are summed over the tensor-parallel ranks); the export scores like transformers."""
    lps, ents = _reference(qwen3["dir"])
    got, ref = qwen3["res"], qwen3["ref"]
    for i in lps:
        assert torch.allclose(got["logprobs"][i], lps[i], atol=TOL, rtol=0), i
        assert torch.allclose(got["entropy"][i], ents[i], atol=TOL, rtol=0), i
    for key in ("loss", "grad_norm"):
        assert abs(got["metrics"][key] - ref["metrics"][key]) < TOL * max(1.0, abs(ref["metrics"][key])), key
    assert set(got["weights"]) == set(ref["weights"])
    assert any(n.endswith("self_attn.q_norm.weight") for n in got["weights"])
    for name, w in ref["weights"].items():
        assert (got["weights"][name] - w).abs().max().item() < TOL, name
    lps_after, _ = _reference(qwen3["dir"], str(qwen3["work"] / "hf"))
    for i, lp in got["logprobs_after"].items():
        assert torch.allclose(lp, lps_after[i], atol=TOL, rtol=0), i


def test_a_dense_model_refuses_to_record_routing(qwen3):
    assert qwen3["res"]["routing_refusal"] == ("megatron backend: role policy: routing asked of a model without "
                                               "MoE layers")


def test_bf16_master_weights_follow_an_fp32_run(models, tmp_path):
    """bf16 with fp32 master weights: after 10 steps (lr 1e-5, most updates below a bf16 weight's
    rounding step) each master is within bf16 rounding of the fp32 run's weight, and the masters'
    updates are the fp32 run's within 5%; bf16 without masters loses most of them (the property the
    masters exist for). Parameters stay bf16, the optimizer state is fp32; a checkpoint holds the
    masters and their state exactly, and the parameters reload as the rounded masters."""
    r = run_ranks(mt.master_scenario, 1, models[False], 10, 1e-5, str(tmp_path / "ckpt"))
    for k, m in r["masters"].items():
        assert torch.equal(r["reloaded"][k], m), k
        assert torch.equal(r["reloaded_state"][k], r["state"][k]), k
        assert torch.equal(r["reloaded_params"][k], r["master"][k]), k
    assert "torch.bfloat16" in r["param_dtypes"] and r["optim_dtypes"] == ["torch.float32"]
    keys = list(r["before"])
    start = {k: r["before"][k].bfloat16().float() for k in keys}  # where the bf16 runs begin
    for k in keys:
        bound = r["before"][k].abs() * 2.0 ** -8 + 2e-5  # half a bf16 step of the start, plus 10 steps' drift
        assert ((r["masters"][k] - r["fp32"][k]).abs() <= bound).all(), k
    du32 = torch.cat([(r["fp32"][k] - r["before"][k]).flatten() for k in keys])
    dmaster = torch.cat([(r["masters"][k] - start[k]).flatten() for k in keys])
    dplain = torch.cat([(r["plain"][k] - start[k]).flatten() for k in keys])
    assert du32.abs().max() > 5e-5  # the fp32 run moved
    assert (dmaster - du32).norm() <= 0.05 * du32.norm()
    assert (dplain - du32).norm() >= 0.5 * du32.norm()
