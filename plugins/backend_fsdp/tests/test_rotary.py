"""Rotary embedding as one autograd function (:mod:`rlweave_backend_fsdp.rotary`): the
values and gradients of transformers' ``apply_rotary_pos_emb``, and what it patches."""

from __future__ import annotations

import pytest
import torch

from rlweave_backend_fsdp.rotary import _wrap, install


def _inputs(dtype, gen):
    t, d = 11, 8
    q = torch.randn(1, t, 4, d, generator=gen).to(dtype).transpose(1, 2)  # the projections' layout
    k = torch.randn(1, t, 2, d, generator=gen).to(dtype).transpose(1, 2)
    ang = torch.arange(t)[:, None].float() * torch.rand(d // 2, generator=gen)[None]
    emb = torch.cat([ang, ang * 1.3], -1)  # halves need not repeat
    return q, k, emb.cos()[None].to(dtype), emb.sin()[None].to(dtype)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_and_gradients_match_transformers(dtype, compiled, monkeypatch):
    """Eager kernels, and the inductor kernel ``install(..., compiled=True)`` switches to."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb as original

    from rlweave_backend_fsdp import rotary

    monkeypatch.setitem(rotary._compiled, "on", compiled)
    fast = _wrap(original)
    gen = torch.Generator().manual_seed(0)
    q0, k0, cos, sin = _inputs(dtype, gen)
    gq, gk = torch.randn(q0.shape, generator=gen).to(dtype), torch.randn(k0.shape, generator=gen).to(dtype)
    res = []
    for fn in (original, fast):
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        a, b = fn(q, k, cos, sin)
        torch.autograd.backward([a, b], [gq, gk])
        res.append((a, b, q.grad, k.grad))
    tol = 1e-6 if dtype == torch.float32 else 3e-2
    for x, y in zip(*res):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert torch.allclose(x.float(), y.float(), atol=tol, rtol=0)
    if not compiled:
        assert res[1][0].stride() == q0.stride()  # written in the input's layout


def test_other_calls_go_to_the_original():
    calls = []

    def original(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(unsqueeze_dim)
        return q, k

    fast = _wrap(original)
    q, k, cos, sin = _inputs(torch.float32, torch.Generator().manual_seed(1))
    fast(q, k, cos, sin, 2)  # another broadcast layout
    fast(q[..., :4], k[..., :4], cos, sin)  # partial rotary
    assert calls == [2, 1]
    out_q, _ = fast(q, k, cos, sin)
    assert calls == [2, 1] and out_q is not q


def test_install_patches_the_model_module_once():
    import transformers.models.qwen2.modeling_qwen2 as mq
    from transformers import Qwen2Config, Qwen2ForCausalLM

    before = mq.apply_rotary_pos_emb
    try:
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1))
        assert install(model) == ["transformers.models.qwen2.modeling_qwen2"]
        assert mq.apply_rotary_pos_emb.rlweave_original is before
        assert install(model) == []  # idempotent
        ids = torch.randint(0, 50, (1, 7))
        patched = model(input_ids=ids).logits
        mq.apply_rotary_pos_emb = before
        assert torch.allclose(patched, model(input_ids=ids).logits, atol=1e-6)
    finally:
        mq.apply_rotary_pos_emb = before


def test_works_inside_torch_compile():
    """Inside a compiled region (compile_scope: layer) the fast path is a graph break, not an error."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb as original

    from rlweave_backend_fsdp.cpu_linear import linear

    fast = _wrap(original)
    gen = torch.Generator().manual_seed(2)
    q0, k0, cos, sin = _inputs(torch.bfloat16, gen)
    w0 = torch.randn(16, 8, generator=gen).to(torch.bfloat16)

    def step(q, k, w):
        a, b = fast(q, k, cos, sin)
        return (linear(a, w).float().sum() + b.float().pow(2).sum())

    res = []
    for fn in (step, torch.compile(step, dynamic=True)):
        q, k, w = q0.clone().requires_grad_(), k0.clone().requires_grad_(), w0.clone().requires_grad_()
        loss = fn(q, k, w)
        loss.backward()
        res.append((loss, q.grad, k.grad, w.grad))
    for x, y in zip(*res):
        assert torch.allclose(x.float(), y.float(), atol=5e-2, rtol=2e-2)
