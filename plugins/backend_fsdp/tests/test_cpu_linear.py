"""CPU-friendly linear layers (:mod:`rlweave.backend_helpers.hf_model.cpu.linear`): same values and
gradients as ``nn.Linear``, and which modules :func:`install` patches."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from rlweave.backend_helpers.hf_model.cpu.linear import install, linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("in_f, out_f", [(16, 48), (48, 16)])  # x transposed / grad transposed
def test_linear_matches_f_linear(dtype, in_f, out_f):
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 7, in_f, generator=g).to(dtype)
    w0 = torch.randn(out_f, in_f, generator=g).to(dtype)
    up = torch.randn(2, 7, out_f, generator=g).to(dtype)
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    y = linear(x, w)
    y.backward(up)
    xr, wr = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    yr = F.linear(xr, wr)
    yr.backward(up)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert y.dtype == dtype and torch.equal(y, yr)  # the forward is F.linear itself
    assert w.grad.shape == w0.shape and w.grad.is_contiguous() and w.grad.dtype == dtype
    assert torch.allclose(x.grad.float(), xr.grad.float(), atol=tol, rtol=tol)
    assert torch.allclose(w.grad.float(), wr.grad.float(), atol=tol, rtol=tol)


def test_input_without_grad_gets_none():
    x = torch.randn(5, 8)
    w = torch.randn(4, 8, requires_grad=True)
    linear(x, w).sum().backward()
    assert x.grad is None and torch.allclose(w.grad, torch.ones(5, 4).t() @ x, atol=1e-5)


def test_install_patches_mlp_and_head_and_keeps_results():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    plain = Qwen2ForCausalLM(cfg)
    fast = copy.deepcopy(plain)
    assert install(fast) == 2 * 3 + 1  # gate/up/down of each layer, the LM head
    assert install(fast) == 0  # idempotent
    patched = {n for n, m in fast.named_modules() if "forward" in m.__dict__}
    assert "lm_head" in patched and "model.layers.0.mlp.down_proj" in patched
    assert not any("self_attn" in n for n in patched)  # attention projections stay nn.Linear
    assert [n for n, _ in fast.named_parameters()] == [n for n, _ in plain.named_parameters()]

    ids = torch.randint(0, 97, (2, 9))
    losses = []
    for m in (plain, fast):
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        losses.append(out.loss)
    assert torch.allclose(losses[0], losses[1], atol=1e-6)
    for (n, a), (_, b) in zip(plain.named_parameters(), fast.named_parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-4), n
