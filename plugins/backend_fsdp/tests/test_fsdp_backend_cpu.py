"""FSDP2 backend on CPU with 2 ranks over gloo, against single-process transformers.

One spawn per scenario (module-scoped fixtures) keeps the suite lean; each test checks one
promise of the issue on the scenario's results. What the backend contract suite checks on the
same model, batch and shards (``test_fsdp_contract.py``: log-probs against transformers, the
first step's loss and gradient norm against plain torch, the HF export reloaded by transformers)
is not repeated here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks
from rlweave.testing.tiny_model import build_tiny_qwen2

sc = import_helper(Path(__file__).with_name("fsdp_scenarios.py"))

TOL = 1e-5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_qwen2(tmp_path_factory.mktemp("fsdp_tiny") / "model", seed=1))


@pytest.fixture(scope="module")
def policy(tiny, tmp_path_factory):
    work = str(tmp_path_factory.mktemp("fsdp_policy"))
    return run_ranks(sc.policy_scenario, 2, tiny, work, timeout_s=600), work


@pytest.fixture(scope="module")
def heads(tiny, tmp_path_factory):
    work = str(tmp_path_factory.mktemp("fsdp_heads"))
    return run_ranks(sc.heads_scenario, 2, tiny, work, timeout_s=600), work


def _maxdiff(a: dict, b: dict) -> float:
    assert set(a) == set(b) == set(range(6))
    return max(float((a[i] - b[i]).abs().max()) for i in a)


def test_entropy_is_that_of_the_reference_distribution(policy, tiny):
    from transformers import AutoModelForCausalLM

    res, _ = policy
    m = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    s = sc.fixed_batch().sequences("input_ids")[3]
    with torch.no_grad():
        lsm = torch.log_softmax(m(s.view(1, -1)).logits[0, :-1], -1)
    ref = torch.cat([torch.zeros(1), -(lsm.exp() * lsm).sum(-1)])
    assert float((res["entropy"][3] - ref).abs().max()) < TOL
    assert float(res["entropy"][3][1:].min()) > 0


def test_packed_equals_padded(policy):
    res, _ = policy
    assert _maxdiff(res["logprobs"], res["logprobs_padded"]) < TOL


def test_shared_prompts_equal_unshared(policy, tiny):
    """GRPO-style groups carried with their prompt once per micro-batch give the same
    log-probs, entropies, losses and gradient norms as the unshared samples, and the
    log-probs are those of transformers on each sample alone."""
    from transformers import AutoModelForCausalLM

    res, _ = policy
    shared, plain = res["group_logprobs_True"], res["group_logprobs_False"]
    assert set(shared) == set(plain) == set(range(9))
    assert max(float((shared[i] - plain[i]).abs().max()) for i in shared) < TOL
    assert max(float((res["group_entropy_True"][i] - res["group_entropy_False"][i]).abs().max())
               for i in shared) < TOL
    m = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    for i, s in enumerate(sc.group_batch().sequences("input_ids")):
        with torch.no_grad():
            lsm = torch.log_softmax(m(s.view(1, -1)).logits[0, :-1], -1)
        ref = torch.cat([torch.zeros(1), lsm.gather(-1, s[1:].view(-1, 1)).squeeze(-1)])
        assert float((shared[i] - ref).abs().max()) < TOL, i
    for a, b in zip(res["group_step_True"], res["group_step_False"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["tokens"] == b["tokens"] == sc.group_batch().num_tokens
    # the shared rows are shorter, so the same budget needs fewer micro-batches
    assert res["group_step_True"][0]["num_micro_batches"] < res["group_step_False"][0]["num_micro_batches"]


def test_train_step_uses_the_loss_functions_temperature(policy):
    """train_step's log-probs are those of logits / loss_fn.temperature, as compute_logprobs'."""
    t = policy[0]["tempered"]
    assert abs(t["train_wlp"] - t["wlp_t05"]) < TOL
    assert abs(t["wlp_t05"] - t["wlp_t1"]) > 100 * TOL


def test_streamed_weights_equal_unsharded_state_dict(policy, tiny):
    from transformers import AutoModelForCausalLM

    res, _ = policy
    sd = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).state_dict()
    streamed = res["streamed0"]
    assert list(streamed) == [k for k in sd if k in streamed] and set(streamed) == set(sd)
    for k, v in sd.items():
        assert streamed[k].shape == v.shape and torch.equal(streamed[k], v), k


def test_training_lowers_loss_and_changes_params(policy, tiny):
    res, _ = policy
    losses = [m["loss"] for m in res["metrics"]]
    assert losses[-1] < losses[0] - 0.5
    changed = [k for k in res["streamed0"] if not torch.equal(res["streamed0"][k], res["streamed1"][k])]
    assert len(changed) == len(res["streamed0"])
    m0 = res["metrics"][0]
    assert m0["tokens"] == sc.fixed_batch().num_tokens and m0["samples"] == 6
    # rank 0 had one sample and padded to the other rank's micro-batch count
    assert m0["num_micro_batches"] >= 2
    assert m0["lr"] == pytest.approx(3e-3) and res["metrics"][3]["lr"] < 3e-3  # warm-up 1, then cosine


def test_dcp_resume_continues_exactly(policy):
    res, _ = policy
    for a, b in zip(res["metrics"][2:], res["metrics_resumed"]):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], abs=1e-6)
        assert a["lr"] == b["lr"]


def test_offload_onload_roundtrip(policy):
    res, _ = policy
    off = res["offload"]
    assert off["param_bytes"] > 0 and off["optim_bytes"] >= 2 * off["param_bytes"]  # AdamW moments
    assert off["freed_bytes"] == 0 and off["device"] == "cpu"  # CPU: state already lives in CPU memory
    assert _maxdiff(res["logprobs_onload"], res["logprobs_after"]) == 0.0


def test_reward_scores_match_sequence_classifier(heads):
    from transformers import AutoModelForSequenceClassification

    res, work = heads
    m = AutoModelForSequenceClassification.from_pretrained(work + "/rm", dtype=torch.float32).eval()
    for i, s in enumerate(sc.fixed_batch().sequences("input_ids")):
        with torch.no_grad():
            ref = m(s.view(1, -1)).logits[0, 0]
        assert float((res["scores"][i][0] - ref).abs()) < TOL


def test_shared_prompt_scores_and_values_equal_unshared(heads):
    res, _ = heads
    for key in ("group_scores", "group_values"):
        a, b = res[f"{key}_True"], res[f"{key}_False"]
        assert set(a) == set(b) == set(range(9))
        assert max(float((a[i] - b[i]).abs().max()) for i in a) < TOL, key
    # the scores differ between samples of a group (read at each sample's own last token)
    assert len({round(float(res["group_scores_True"][i]), 6) for i in range(3)}) == 3


def test_critic_initialised_from_reward_model(heads):
    res, work = heads
    assert _maxdiff(res["critic_last"], res["scores"]) < TOL
    vl = [m["vloss"] for m in res["critic_metrics"]]
    assert vl[-1] < vl[0]
    from transformers import AutoModelForTokenClassification

    m = AutoModelForTokenClassification.from_pretrained(work + "/critic", dtype=torch.float32)
    assert m.score.weight.shape == (1, 64)


def test_bf16_mixed_precision_with_activation_checkpointing(heads, tiny):
    res, _ = heads
    assert res["bf16_param_dtype"] == "torch.float32"  # fp32 master weights
    diff = _maxdiff(res["bf16_logprobs"], sc.reference_logprobs(tiny))
    assert 0 < diff < 0.15  # bf16 compute: close to fp32, not identical
    losses = [m["loss"] for m in res["bf16_metrics"]]
    assert losses[-1] < losses[0] and all(m["grad_norm"] > 0 for m in res["bf16_metrics"])


@pytest.fixture(scope="module")
def compiled(tiny, tmp_path_factory):
    """Every compiled run of the tests below in one spawned rank (eager once, ``compile_scope``
    ``layer`` and ``auto``, then the bf16 attention-backward pair), so inductor's start-up and
    its in-process caches are paid once: the slowest runs of the suite with an empty inductor
    cache. The bf16 pair runs on a CPU with fast bf16 (``RLWEAVE_CPU_BF16_RATIO`` 0.15, injected
    by the scenario for those two workers only, so the test runs on any CPU)."""
    work = str(tmp_path_factory.mktemp("fsdp_compiled"))
    return run_ranks(sc.compiled_cpu_scenario, 1, tiny, work, ["auto"], "0.15", timeout_s=840)


def test_compiled_layers_equal_eager(compiled):
    """compile: true (on CPU by default each decoder layer's norms and MLP; attention eager)
    gives the eager log-probs and training losses, for packed and shared-prompt rows of
    several shapes. Whole compiled layers (``compile_scope: layer``, the CUDA default) are
    checked the same way by the GPU test, and chosen by :func:`test_compile_units_of_each_scope`."""
    eager, comp = compiled["eager"], compiled["auto"]
    assert eager["compiled"] == [] and eager["graphs"] == 0
    # the tiny model's two layers, really compiled (graphs made by this worker, not by the runs before it)
    assert comp["compiled"] == sorted(["Qwen2MLP", "Qwen2RMSNorm", "Qwen2RMSNorm"] * 2) and comp["graphs"] > 0
    for k in ("lp_packed", "lp_shared"):
        assert eager[k].shape == comp[k].shape and float((eager[k] - comp[k]).abs().max()) < 1e-4, k
    assert comp["losses"] == pytest.approx(eager["losses"], abs=1e-4)
    assert eager["losses"][2] < eager["losses"][0]  # it trained: the same batch scores better afterwards


def test_compile_units_of_each_scope(tiny):
    """``layer`` compiles the decoder layer itself, ``mlp_norms`` its children but attention;
    an unknown scope and ``mlp_norms`` on a layer without ``self_attn`` are refused by name."""
    from transformers import AutoModelForCausalLM

    from rlweave.backend_helpers.hf_model.modeling import decoder_layers
    from rlweave_backend_fsdp.parallelize import compile_units

    layer = decoder_layers(AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32))[0]
    assert compile_units(layer, "layer") == [layer]
    assert compile_units(layer, "mlp_norms") == [m for m in layer.children() if m is not layer.self_attn]
    assert layer.mlp in compile_units(layer, "mlp_norms") and len(compile_units(layer, "mlp_norms")) == 3
    with pytest.raises(ValueError, match="compile_scope 'whole'"):
        compile_units(layer, "whole")
    with pytest.raises(ValueError, match="has no self_attn; use layer"):
        compile_units(layer.mlp, "mlp_norms")


def test_bf16_compiled_attention_backward_trains_like_fp32_backward(compiled):
    """bf16 + compile on a CPU with fast bf16 (injected, so the test runs on any CPU):
    ``cpu.attention_backward: auto`` sets every attention module to the compiled bf16
    backward, and training follows the fp32 backward's losses within bf16 rounding; compiled, that
    backward gives per-sample attention's gradients on masked shared-prompt buckets
    (``fsdp_scenarios.shared_prompt_attention``)."""
    fp32, auto = compiled["bf16_fp32"], compiled["bf16_auto"]
    assert fp32["marks"] == ["fp32", "fp32"] and auto["marks"] == ["bf16", "bf16"]
    assert auto["losses"] == pytest.approx(fp32["losses"], abs=3e-2)
    assert auto["losses"][1:] != fp32["losses"][1:]  # another backward really ran (the first loss precedes it)
    assert auto["losses"][2] < auto["losses"][0]  # it trained
    assert compiled["bf16_shared_prompt_close"]  # the compiled backward: per-sample attention's gradients
    # one graph per kind of bucket (one row or several, one token or more), whatever the layout of the views it
    # was given: not a new one for each, up to dynamo's recompile limit (8), past which it would run eagerly
    assert 0 < compiled["bf16_backward_graphs"] <= 4
