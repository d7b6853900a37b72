"""Grouped experts (torch grouped_mm) vs the per-expert reference vs Hugging Face's own eager
experts loop, in fp32 on CPU: outputs and gradients of the hidden states, the routing weights
and both weight tensors agree within 1e-5 (relative to the largest entry when that exceeds 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlweave.testing.helper_modules import import_helper
from rlweave_kernel_moe import experts, routing, torch_grouped
from torch.func import functional_call

_problems = import_helper(Path(__file__).with_name("experts_problems.py"))
forward_backward, make_problem, max_diff = _problems.forward_backward, _problems.make_problem, _problems.max_diff

TOL = 1e-5


def hf_eager(problem):
    """transformers' Qwen3MoeExperts with experts_implementation='eager', on the problem's weights."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    e, two_i, h = problem.gate_up.shape
    cfg = Qwen3MoeConfig(hidden_size=h, moe_intermediate_size=two_i // 2, num_experts=e, hidden_act="silu")
    cfg._experts_implementation = "eager"
    module = Qwen3MoeExperts(cfg)
    return functional_call(module, {"gate_up_proj": problem.gate_up, "down_proj": problem.down},
                           (problem.hidden, problem.top_k_index, problem.top_k_weights))


def ours(impl):
    def fn(p):
        return experts.grouped_experts(p.hidden, p.top_k_index, p.top_k_weights, p.gate_up, p.down,
                                       torch.nn.functional.silu, impl)
    return fn


CASES = {
    # name: (tokens, hidden, intermediate, experts, top_k, active, incoming gradient)
    "zero-token experts, top-2": (24, 32, 16, 8, 2, 5, "random"),
    "top-1": (16, 32, 16, 4, 1, 4, "random"),
    "top-4, uneven sizes": (40, 64, 24, 8, 4, 8, "random"),
    "one token": (1, 32, 16, 8, 4, 8, "random"),
    "y.sum().backward() (zero-stride gradient)": (20, 32, 16, 6, 2, 4, "sum"),
    "unaligned hidden and intermediate (fallback)": (20, 30, 10, 6, 2, 5, "random"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_torch_and_reference_match_hf_eager(case):
    tokens, hidden, inter, n_exp, top_k, active, grad = CASES[case]
    problem = make_problem(tokens, hidden, inter, n_exp, top_k, active=active, seed=len(case))
    want = forward_backward(hf_eager, problem, grad)
    for impl in ("torch", "reference"):
        got = forward_backward(ours(impl), problem, grad)
        diffs = max_diff(got, want)
        assert max(diffs.values()) <= TOL, (impl, diffs)
    if active < n_exp:  # experts without tokens get exactly zero gradient
        assert got[3][active:].abs().max() == 0 and got[4][active:].abs().max() == 0


def test_unaligned_shape_runs_the_reference_and_says_why():
    problem = make_problem(8, 30, 10, 4, 2)
    before = sum(experts.fallbacks().values())
    forward_backward(ours("torch"), problem)
    reasons = experts.fallbacks()
    assert sum(reasons.values()) == before + 1
    assert any("hidden size 30" in r and "intermediate size 10" in r for r in reasons)
    assert torch_grouped.layout_problem(32, 16, torch.float32) is None
    assert torch_grouped.layout_problem(32, 12, torch.bfloat16) is not None  # 24 bytes


def test_grouped_linear_takes_a_zero_stride_gradient():
    x = torch.randn(10, 16, requires_grad=True)
    w = torch.randn(3, 8, 16, requires_grad=True)
    offs = torch.tensor([4, 4, 10], dtype=torch.int32)
    torch_grouped.grouped_linear(x, w, offs).sum().backward()
    want_w = torch.zeros(3, 8, 16)
    want_w[0] = x[:4].sum(0).expand(8, 16)
    want_w[2] = x[4:].sum(0).expand(8, 16)
    torch.testing.assert_close(w.grad, want_w, rtol=1e-5, atol=1e-5)


def test_no_tokens():
    p = make_problem(3, 32, 16, 4, 2)
    hidden = p.hidden[:0].detach().requires_grad_()
    for impl in ("torch", "reference"):
        y = experts.grouped_experts(hidden, p.top_k_index[:0], p.top_k_weights[:0], p.gate_up, p.down,
                                    torch.nn.functional.silu, impl)
        assert y.shape == (0, 32)


def test_bf16_matches_reference_loosely():
    problem = make_problem(32, 64, 32, 8, 2, active=6, dtype=torch.bfloat16)
    want = forward_backward(ours("reference"), problem)
    got = forward_backward(ours("torch"), problem)
    diffs = max_diff(got, want)
    assert max(diffs.values()) <= 3e-2, diffs
    assert got[0].dtype == torch.bfloat16


def test_routing_sorts_stably_and_inverts():
    idx = torch.tensor([[2, 0], [0, 3], [2, 3]])
    r = routing.route(idx, num_experts=5)
    assert r.order.tolist() == [1, 2, 0, 4, 3, 5]         # expert 0: pairs 1, 2; expert 2: 0, 4; expert 3: 3, 5
    assert r.token.tolist() == [0, 1, 0, 2, 1, 2]
    assert r.counts.tolist() == [2, 0, 2, 2, 0]
    assert r.offsets.tolist() == [2, 2, 4, 6, 6] and r.offsets.dtype == torch.int32
    assert r.order[r.inverse].tolist() == list(range(6))
    rows = torch.arange(6.0).unsqueeze(1).requires_grad_()  # row i carries i
    w = torch.tensor([[1.0, 10.0], [100.0, 1000.0], [0.5, 0.25]], requires_grad=True)
    out = routing.unpermute(rows, w, r, torch.float32)
    # token 0: pair 0 (row 2) * 1 + pair 1 (row 0) * 10; token 1: row 1 * 100 + row 4 * 1000; ...
    assert out.squeeze(1).tolist() == [2.0, 4100.0, 3 * 0.5 + 5 * 0.25]
    out.sum().backward()
    assert w.grad.tolist() == [[2.0, 0.0], [1.0, 4.0], [3.0, 5.0]]


def test_unknown_implementation_is_refused():
    p = make_problem(2, 32, 16, 4, 2)
    with pytest.raises(ValueError, match="choose one of triton, torch, reference"):
        experts.grouped_experts(p.hidden, p.top_k_index, p.top_k_weights, p.gate_up, p.down,
                                torch.nn.functional.silu, "cutlass")
