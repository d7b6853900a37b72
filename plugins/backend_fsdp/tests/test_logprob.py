"""Chunked log-probs and entropy (:mod:`rlweave.backend_helpers.hf_model.logprob`) against the plain
fp32 ``log_softmax`` computation: values and gradients, shared rows, temperature, dtypes."""

from __future__ import annotations

import pytest
import torch

from rlweave.backend_helpers.hf_model.logprob import selected_logprobs


def _reference(logits, rows, targets, temperature):
    lsm = torch.log_softmax(logits.float() / temperature, dim=-1)
    return lsm[rows, targets], (-(lsm.exp() * lsm).sum(-1))[rows]


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("dtype, temperature", [(torch.float32, 1.0), (torch.float32, 0.7), (torch.bfloat16, 1.0),
                                                (torch.bfloat16, 1.3)])
def test_values_and_gradients_match_log_softmax(dtype, temperature, compiled):
    """Eager chunks, and the inductor kernels (``compiled``)."""
    g = torch.Generator().manual_seed(0)
    n_rows, vocab, n_tok = 37, 101, 60
    base = (torch.randn(n_rows, vocab, generator=g) * 3).to(dtype)
    # several tokens read the same row (shared prompts), some rows are read by none
    rows = torch.randint(0, n_rows - 3, (n_tok,), generator=g)
    targets = torch.randint(0, vocab, (n_tok,), generator=g)
    w_lp, w_ent = torch.randn(n_tok, generator=g), torch.randn(n_tok, generator=g)

    ours = base.clone().requires_grad_()
    lp, ent = selected_logprobs(ours, rows, targets, temperature, with_entropy=True, chunk_elements=3 * vocab + 5,
                                compiled=compiled)
    (lp * w_lp + ent * w_ent).sum().backward()
    ref = base.clone().requires_grad_()
    lp_r, ent_r = _reference(ref, rows, targets, temperature)
    (lp_r * w_lp + ent_r * w_ent).sum().backward()

    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == (n_tok,)
    assert torch.allclose(lp, lp_r, atol=1e-5) and torch.allclose(ent, ent_r, atol=1e-5)
    assert ours.grad.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 2e-2  # the gradient is written in the logits' dtype
    assert torch.allclose(ours.grad.float(), ref.grad.float(), atol=tol, rtol=tol)
    assert ours.grad[-3:].abs().max() == 0  # rows nobody reads get no gradient
    assert torch.equal(ours.detach(), base)  # the logits are not modified in place (fp32 .float() is no copy)


@pytest.mark.parametrize("compiled", [False, True])
def test_log_prob_only_gradient_and_no_entropy(compiled):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 17, generator=g, requires_grad=True)
    rows, targets = torch.arange(9), torch.randint(0, 17, (9,), generator=g)
    lp, ent = selected_logprobs(logits, rows, targets, with_entropy=False, chunk_elements=17, compiled=compiled)
    assert ent is None
    lp.sum().backward()
    expected = torch.nn.functional.one_hot(targets, 17) - torch.softmax(logits.detach(), -1)
    assert torch.allclose(logits.grad, expected, atol=1e-6)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="temperature"):
        selected_logprobs(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long), 0.0)
    with pytest.raises(ValueError, match="rows, vocab"):
        selected_logprobs(torch.zeros(1, 2, 3), torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long))
