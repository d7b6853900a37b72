"""Rotary embedding as one autograd function (:mod:`rlweave.backend_helpers.hf_model.cpu.rotary`): the
values and gradients of transformers' ``apply_rotary_pos_emb``, and that it applies to the
models prepared with it alone."""

from __future__ import annotations

import pytest
import torch

from rlweave.backend_helpers.hf_model.cpu import rotary
from rlweave.backend_helpers.hf_model.cpu.rotary import Rotary, _wrap, running

QWEN2 = "transformers.models.qwen2.modeling_qwen2"


def _inputs(dtype, gen):
    t, d = 11, 8
    q = torch.randn(1, t, 4, d, generator=gen).to(dtype).transpose(1, 2)  # the projections' layout
    k = torch.randn(1, t, 2, d, generator=gen).to(dtype).transpose(1, 2)
    ang = torch.arange(t)[:, None].float() * torch.rand(d // 2, generator=gen)[None]
    emb = torch.cat([ang, ang * 1.3], -1)  # halves need not repeat
    return q, k, emb.cos()[None].to(dtype), emb.sin()[None].to(dtype)


@pytest.fixture
def fresh_routing(monkeypatch):
    """transformers' module as it was, and no routing recorded; both restored afterwards."""
    import transformers.models.qwen2.modeling_qwen2 as mq

    monkeypatch.setattr(mq, "apply_rotary_pos_emb", rotary.original(QWEN2) or mq.apply_rotary_pos_emb)
    monkeypatch.setattr(rotary, "_ORIGINALS", {})
    return mq


def _tiny(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1))


def _uses_rotary_function(out: torch.Tensor) -> bool:
    """Whether rlweave's rotary autograd function is in ``out``'s backward graph."""
    seen, todo = set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if "_Rotary" in type(fn).__name__:
            return True
        todo += [f for f, _ in fn.next_functions]
    return False


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_and_gradients_match_transformers(dtype, compiled, fresh_routing):
    """Eager kernels, and the inductor kernel of a model prepared with ``compile``. transformers'
    own function (a model prepared earlier in this process routes the module's name to ours)."""
    original = fresh_routing.apply_rotary_pos_emb
    fast = _wrap(original)
    gen = torch.Generator().manual_seed(0)
    q0, k0, cos, sin = _inputs(dtype, gen)
    gq, gk = torch.randn(q0.shape, generator=gen).to(dtype), torch.randn(k0.shape, generator=gen).to(dtype)
    res = []
    for fn in (original, fast):
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        with running(Rotary(compiled=compiled)):
            a, b = fn(q, k, cos, sin)
        torch.autograd.backward([a, b], [gq, gk])  # outside: the backward keeps the forward's choice
        res.append((a, b, q.grad, k.grad))
    assert _uses_rotary_function(res[1][0]) and not _uses_rotary_function(res[0][0])
    tol = 1e-6 if dtype == torch.float32 else 3e-2
    for x, y in zip(*res):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert torch.allclose(x.float(), y.float(), atol=tol, rtol=0)
    if not compiled:
        assert res[1][0].stride() == q0.stride()  # written in the input's layout


def test_other_calls_and_calls_outside_a_prepared_layer_go_to_the_original():
    calls = []

    def original(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(unsqueeze_dim)
        return q, k

    fast = _wrap(original)
    q, k, cos, sin = _inputs(torch.float32, torch.Generator().manual_seed(1))
    assert fast(q, k, cos, sin) == (q, k) and calls == [1]  # no prepared layer running
    with running(Rotary()):
        fast(q, k, cos, sin, 2)  # another broadcast layout
        fast(q[..., :4], k[..., :4], cos, sin)  # partial rotary
        assert calls == [1, 2, 1]
        out_q, _ = fast(q, k, cos, sin)
    assert calls == [1, 2, 1] and out_q is not q
    assert rotary.active() is None


def test_install_applies_to_its_model_only(fresh_routing):
    """A model prepared with the kernels uses them; a second model in the same process,
    built before or after, runs transformers' own code (bit for bit, in bf16)."""
    mq = fresh_routing
    before = mq.apply_rotary_pos_emb
    prepared, other = _tiny(0).bfloat16(), _tiny(1).bfloat16()
    ids = torch.randint(0, 50, (1, 7))
    other_before = other(input_ids=ids).logits
    reference = prepared(input_ids=ids).logits
    assert rotary.install(prepared, list(prepared.model.layers)) == [QWEN2]
    assert rotary.original(QWEN2) is before and mq.apply_rotary_pos_emb is not before
    seen = []
    for model in (prepared, other):
        model.model.layers[0].self_attn.register_forward_hook(lambda m, a, o: seen.append(rotary.active()))
    got = prepared(input_ids=ids).logits
    assert _uses_rotary_function(got) and seen == [Rotary(compiled=False)]
    assert torch.allclose(got.float(), reference.float(), atol=5e-2)
    late = _tiny(2).bfloat16()  # built after the routing
    for model, expected in ((other, other_before), (late, late(input_ids=ids).logits)):
        out = model(input_ids=ids).logits
        assert not _uses_rotary_function(out) and torch.equal(out, expected)
    assert seen[1:] == [None]
    assert rotary.install(late, []) == []  # routing happens once per module


def test_activation_checkpointing_recomputes_with_the_same_rotary(fresh_routing):
    """The recomputation in backward runs the layer's hooks again: same path, same gradients."""
    grads = []
    for checkpointing in (False, True):
        model = _tiny(0)
        rotary.install(model, list(model.model.layers))
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        out = model(input_ids=torch.arange(9)[None] % 50).logits
        assert _uses_rotary_function(out)
        out.float().pow(2).mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert rotary.active() is None
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)


def test_works_inside_torch_compile():
    """Inside a compiled region (compile_scope: layer) the fast path is a graph break, not an error."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb as original

    from rlweave.backend_helpers.hf_model.cpu.linear import linear

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
        with running(Rotary()):
            loss = fn(q, k, w)
        loss.backward()
        res.append((loss, q.grad, k.grad, w.grad))
    for x, y in zip(*res):
        assert torch.allclose(x.float(), y.float(), atol=5e-2, rtol=2e-2)
