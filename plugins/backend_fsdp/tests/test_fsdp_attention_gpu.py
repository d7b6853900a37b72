"""The CUDA attention paths in bf16: the fused ``varlen_attn`` call for packed rows and the
planned SDPA for shared-prompt rows, against causal SDPA of each sample on its own.

Skipped without CUDA. Outputs: both bf16 sides within bf16 tolerances of each other. Gradients:
each bf16 side close to the exact (fp32) per-sample gradient, since bf16 sums of a shared
prompt's gradient over its samples round differently on the two sides.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
ATOL, RTOL = 3e-2, 2e-2


class _Module(torch.nn.Module):
    """What the attention function reads from its module: ``training``."""


def _per_sample(q, k, v, bounds):
    return torch.cat([
        F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True, enable_gqa=True)
        for s, e in zip(bounds[:-1], bounds[1:])
    ], dim=2).transpose(1, 2)


def _qkv(t: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h: torch.randn(1, h, t, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()  # noqa: E731
    return mk(8), mk(2), mk(2)


def _grads(out, w, leaves):
    for x in leaves:
        x.grad = None
    (out.float() * w).sum().backward()
    return [x.grad.clone() for x in leaves]


def _fp32_leaves(leaves):
    return [x.detach().float().requires_grad_() for x in leaves]


def _close_to_exact(got, exact, rel: float = 1e-2) -> None:
    """``got`` (bf16 path) near ``exact`` (fp32): relative Frobenius error, and no element off by
    more than ``4 * rel`` of the largest magnitude."""
    got, exact = got.float(), exact.float()
    err = float((got - exact).norm() / exact.norm())
    worst = float((got - exact).abs().max() / exact.abs().max())
    assert err < rel and worst < 4 * rel, (err, worst)


def test_fused_varlen_attention_equals_per_sample_bf16():
    """Packed row on CUDA in bf16 takes the fused path (one call) and equals per-sample causal
    attention, forward and backward; mixed lengths including a length-1 sample."""
    from rlweave.backend_helpers.hf_model.attention import _varlen_fused, varlen_attention_forward

    if _varlen_fused()[0] is None:
        pytest.skip("this torch has no torch.nn.attention.varlen.varlen_attn")
    lens = [37, 5, 128, 1, 64, 64, 300]
    bounds = [0]
    for n in lens:
        bounds.append(bounds[-1] + n)
    q, k, v = _qkv(bounds[-1])
    cu = torch.tensor(bounds, device="cuda", dtype=torch.int32)
    m = _Module().eval()
    got, _ = varlen_attention_forward(m, q, k, v, None, scaling=None, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                      max_length_q=max(lens), max_length_k=max(lens))
    ref = _per_sample(q, k, v, bounds)
    assert got.shape == ref.shape == (1, bounds[-1], 8, 64) and got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), ref.float(), atol=ATOL, rtol=RTOL)
    w = torch.randn(got.shape, device="cuda")
    for a, b in zip(_grads(got, w, (q, k, v)), _grads(ref, w, (q, k, v))):
        assert torch.allclose(a.float(), b.float(), atol=ATOL, rtol=RTOL)


def test_shared_prompt_attention_on_cuda_equals_unshared_bf16():
    """A shared-prompt row (planned SDPA with prefix masks) on CUDA in bf16 gives every
    original token its unshared attention output and gradients."""
    from rlweave.backend_helpers.hf_model.attention import planned_sdpa
    from rlweave.backend_helpers.hf_model.prefix import share

    torch.manual_seed(0)
    prompts = {0: list(range(1, 33)), 1: list(range(40, 57))}
    samples = [(0, [3] * 128), (0, [4] * 90), (1, [5] * 7), (0, [6]), (1, [7] * 128), (1, [])]
    seqs = [prompts[p] + r for p, r in samples]
    plens = [len(prompts[p]) for p, _ in samples]
    cu = torch.tensor([0] + [sum(len(x) for x in seqs[: i + 1]) for i in range(len(seqs))])
    ids = torch.tensor([t for x in seqs for t in x])
    row = share(ids, cu, plens)
    assert row is not None and row.input_ids.numel() < ids.numel()
    q, k, v = _qkv(row.input_ids.numel(), seed=1)
    tok = row.tok_row.cuda()
    got = planned_sdpa(q, k, v, row.plan, None, 0.0, True)[:, tok]
    ref = _per_sample(*(x[:, :, tok] for x in (q, k, v)), cu.tolist())
    assert got.device.type == "cuda" and got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), ref.float(), atol=ATOL, rtol=RTOL)
    exact_leaves = _fp32_leaves((q, k, v))
    exact = _per_sample(*(x[:, :, tok] for x in exact_leaves), cu.tolist())
    w = torch.randn(got.shape, device="cuda")
    for a, b, e in zip(_grads(got, w, (q, k, v)), _grads(ref, w, (q, k, v)), _grads(exact, w, exact_leaves)):
        _close_to_exact(a, e)
        _close_to_exact(b, e)
