"""The load-balancing loss's gradient attached to the MoE layers' outputs (:mod:`.aux_grad`), in one
process on a toy two-layer stack: it equals the gradient of the loss made of the router logits,
with and without activation recomputation (``torch.utils.checkpoint``, reentrant like megatron's),
padding rows excluded; an empty micro-batch adds exact zeros."""

from __future__ import annotations

import pytest
import torch

from rlweave.backend_helpers.moe import AuxLoss
from rlweave_backend_megatron import aux_grad

E, H, T, K = 6, 5, 11, 2
KEEP = torch.tensor([0, 1, 2, 4, 5, 7, 8])  # real rows; the others are padding


class Layer(torch.nn.Module):
    """Router logits of ``x``, their softmax mixed into the output (so the router has a gradient
    from the main loss too), the output through :func:`aux_grad.attach`."""

    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.router = torch.nn.Parameter(torch.randn(E, H, generator=g))
        self.mix = torch.nn.Parameter(torch.randn(E, H, generator=g) * 0.1)
        self.tap: list | None = None
        self.aux: aux_grad.AuxGrad | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = x @ self.router.T
        if self.tap is not None:
            self.tap.append(logits)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        return aux_grad.attach(torch.tanh(x + probs @ self.mix), probs, self.aux)


def _stack():
    return [Layer(1), Layer(2)]


def _run(layers, x: torch.Tensor, tokens: int, recompute: bool, attach: bool, step_tokens: int = 20):
    """``(loss value, moe_aux_loss, routers' gradients)`` of one micro-batch: the aux loss's gradient
    by the attachment (``attach``) or by differentiating ``micro_loss``."""
    aux = AuxLoss(len(layers), E, K, coef=0.3)
    aux.begin_step(step_tokens, x.device)
    logits: list = []
    for m in layers:
        m.tap = logits
    state = aux_grad.set_aux(layers, KEEP if attach else None)
    h = x
    for m in layers:
        h = torch.utils.checkpoint.checkpoint(m, h, use_reentrant=True) if recompute else m(h)
    for m in layers:
        m.tap = None  # a recomputation in backward is not collected
    main = (h[KEEP] ** 2).sum()
    kept = [t.index_select(0, KEEP) for t in logits]
    if attach:
        value, grad = aux.micro_value_and_grad(kept, tokens)
        state.probs_grad = grad
        loss = main + value
    else:
        loss = main + aux.micro_loss(kept, tokens)
    loss.backward()
    grads = [m.router.grad.clone() for m in layers]
    aux_grad.set_aux(layers, None)
    return float(loss.detach()), aux.step_metrics()[0]["moe_aux_loss"], grads


@pytest.mark.parametrize("recompute", [False, True])
def test_attached_gradient_equals_the_loss_gradient(recompute):
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(0), requires_grad=True)
    ref = _run(_stack(), x, 7, recompute=False, attach=False)
    got = _run(_stack(), x, 7, recompute=recompute, attach=True)
    assert got[0] == pytest.approx(ref[0], rel=1e-6)
    assert got[1] == ref[1] and ref[1] > 0  # the reported aux loss is the same number
    for a, b in zip(ref[2], got[2]):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_recompute_without_attachment_loses_the_router_gradient():
    """Why the attachment exists: the logits collected under recomputation have no graph."""
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(0), requires_grad=True)
    ref = _run(_stack(), x, 7, recompute=False, attach=False)
    lost = _run(_stack(), x, 7, recompute=True, attach=False)
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b in zip(ref[2], lost[2]))


def test_an_empty_micro_batch_adds_exact_zeros():
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(0), requires_grad=True)
    aux = AuxLoss(2, E, K, coef=0.3)
    aux.begin_step(20, x.device)
    value, grad = aux.micro_value_and_grad([torch.randn(7, E), torch.randn(7, E)], 0)
    assert float(value) == 0.0 and grad is None
    plain = _run(_stack(), x, 0, recompute=True, attach=False)
    attached = _run(_stack(), x, 0, recompute=True, attach=True)
    assert plain[1] == attached[1] == 0.0
    for a, b in zip(plain[2], attached[2]):
        assert torch.equal(a, b)


def test_nothing_attached_outside_training():
    layer = Layer(3)
    x = torch.randn(T, H)
    probs = torch.softmax(x @ layer.router.T, dim=-1)
    out = torch.randn(T, H)
    assert aux_grad.attach(out, probs, None) is out
    with torch.no_grad():
        assert aux_grad.attach(out, torch.softmax(x @ layer.router.T, dim=-1), aux_grad.AuxGrad(KEEP)) is out
