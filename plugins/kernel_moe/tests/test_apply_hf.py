"""``KERNEL.apply`` on whole tiny Hugging Face MoE models (random init from a config): fp32
logits and every parameter gradient equal the same model on transformers' eager experts loop
within 1e-5, with experts that receive no tokens, top-k > 1 and ``norm_topk_prob`` both ways;
parameters and state-dict keys are untouched."""

from __future__ import annotations

import copy

import pytest
import torch
from rlweave_kernel_moe.kernel import KERNEL

TOL = 1e-5
VOCAB = 96


def build(arch: str, norm_topk_prob: bool, top_k: int):
    import transformers

    common = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64, "num_experts_per_tok": top_k,
              "tie_word_embeddings": False}
    if arch == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**common, head_dim=8, moe_intermediate_size=16, num_experts=32,
                                          intermediate_size=64, norm_topk_prob=norm_topk_prob)
        cls = transformers.Qwen3MoeForCausalLM
    elif arch == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(**common, moe_intermediate_size=16, num_experts=32, intermediate_size=64,
                                          shared_expert_intermediate_size=32, norm_topk_prob=norm_topk_prob)
        cls = transformers.Qwen2MoeForCausalLM
    else:  # mixtral: always renormalises its top-k
        cfg = transformers.MixtralConfig(**common, intermediate_size=16, num_local_experts=32)
        cls = transformers.MixtralForCausalLM
    cfg._experts_implementation = "eager"
    torch.manual_seed(0)
    model = cls(cfg).float().eval()
    # The default init leaves routers near zero; spread them so routing is uneven.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                p.normal_(0, 0.5)
    return model


def moe_layers(model) -> int:
    return sum(1 for m in model.modules() if type(m).__name__.endswith("SparseMoeBlock"))


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                 if p.grad is not None}


CASES = [("qwen3_moe", True, 2), ("qwen3_moe", False, 3), ("qwen2_moe", True, 2), ("qwen2_moe", False, 4),
         ("mixtral", True, 2)]


@pytest.mark.parametrize("arch,norm_topk_prob,top_k", CASES)
def test_apply_matches_eager(arch, norm_topk_prob, top_k):
    eager = build(arch, norm_topk_prob, top_k)
    ours = copy.deepcopy(eager)
    keys_before = list(ours.state_dict())
    info = KERNEL.apply(ours, device="cpu")
    assert info["replaced"] == moe_layers(eager) == 2
    assert info["impl"] == "torch" and info["skipped"] == {} and info["fallback"] == {}
    assert list(ours.state_dict()) == keys_before

    # record the routing: some expert must receive no token, so that case is covered
    seen = []
    hooks = [m.register_forward_pre_hook(lambda m, a: seen.append(a[1].detach().clone()))
             for m in ours.modules() if "_moe_groupgemm_impl" in m.__dict__]
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    logits_e, grads_e = loss_and_grads(eager, ids)
    logits_o, grads_o = loss_and_grads(ours, ids)
    for h in hooks:
        h.remove()
    assert any(torch.bincount(idx.flatten(), minlength=32).min() == 0 for idx in seen)
    assert all(idx.shape[1] == top_k for idx in seen)

    assert (logits_o - logits_e).abs().max() <= TOL
    assert grads_o.keys() == grads_e.keys()
    assert any("gate_up_proj" in n for n in grads_o) and any(".gate.weight" in n for n in grads_o)
    for name in grads_e:
        scale = max(1.0, grads_e[name].abs().max().item())
        assert (grads_o[name] - grads_e[name]).abs().max() <= TOL * scale, name

    # parameters untouched, and the original forward comes back
    for (n1, p1), (n2, p2) in zip(eager.named_parameters(), ours.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    assert KERNEL.remove(ours) == 2
    assert not any("_moe_groupgemm_impl" in m.__dict__ for m in ours.modules())


def test_copy_of_a_patched_model_uses_its_own_weights():
    model = build("qwen3_moe", True, 2)
    KERNEL.apply(model, device="cpu", impl="reference")
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in clone.named_parameters():
            if "gate_up_proj" in n:
                p.zero_()
    ids = torch.randint(0, VOCAB, (1, 5))
    experts = [m for m in clone.modules() if "_moe_groupgemm_impl" in m.__dict__]
    assert experts and all(m.forward.__self__ is m for m in experts)
    assert not torch.equal(model(input_ids=ids).logits, clone(input_ids=ids).logits)


class OddExperts(torch.nn.Module):
    """Looks like experts (stacked gate_up_proj/down_proj, act_fn) but is no transformers class."""

    def __init__(self):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.zeros(4, 8, 16))
        self.down_proj = torch.nn.Parameter(torch.zeros(4, 16, 4))
        self.act_fn = torch.nn.SiLU()


def test_unknown_or_different_experts_are_left_alone_with_the_reason():
    model = torch.nn.ModuleDict({"odd": OddExperts()})
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    biased = Qwen3MoeExperts(Qwen3MoeConfig(hidden_size=16, moe_intermediate_size=4, num_experts=4))
    biased.has_bias = True
    model["biased"] = biased
    info = KERNEL.apply(model, device="cpu")
    assert info["replaced"] == 0
    assert "not a transformers experts module" in info["skipped"]["odd"]
    assert "has_bias=True" in info["skipped"]["biased"]
    assert "forward" not in model["odd"].__dict__


def test_apply_reports_shapes_that_fall_back():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    module = Qwen3MoeExperts(Qwen3MoeConfig(hidden_size=30, moe_intermediate_size=10, num_experts=4))
    info = KERNEL.apply(torch.nn.ModuleDict({"experts": module}), device="cpu")
    assert info["replaced"] == 1 and "hidden size 30" in info["fallback"]["experts"]


def test_implementation_choice_and_forced_impls():
    assert KERNEL.implementation("cpu") == "torch"
    assert KERNEL.why_not("reference", "cpu") is None
    assert "CUDA" in KERNEL.why_not("triton", "cpu")
    with pytest.raises(ValueError, match="'triton' cannot run on cpu"):
        KERNEL.apply(torch.nn.Linear(2, 2), device="cpu", impl="triton")
    with pytest.raises(ValueError, match="unknown MoE experts implementation"):
        KERNEL.apply(torch.nn.Linear(2, 2), device="cpu", impl="cutlass")
