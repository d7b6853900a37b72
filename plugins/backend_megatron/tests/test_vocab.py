"""Log-probs and entropy from vocabulary-parallel logits (:mod:`rlweave_backend_megatron.vocab`):
one rank holding the whole padded vocabulary, and two gloo ranks each holding half of the
columns, against ``torch.log_softmax`` over the real vocabulary (values and gradients)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlweave.testing.helper_modules import import_helper
from rlweave_backend_megatron import vocab

_scenarios = import_helper(Path(__file__).with_name("vocab_scenarios.py"))
case_tensors = _scenarios.case_tensors


def reference(logits: torch.Tensor, targets: torch.Tensor, n_vocab: int, temperature: float):
    """Full-softmax log-probs and entropy over the first ``n_vocab`` columns."""
    logp = torch.log_softmax(logits[:, :n_vocab].float() / temperature, dim=-1)
    lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def grads(fn, logits: torch.Tensor, targets, weights) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients w.r.t. ``logits`` of ``sum(lp)`` and of ``sum(weights * entropy)``."""
    out = []
    for i in range(2):
        x = logits.clone().requires_grad_(True)
        lp, ent = fn(x)
        (lp.sum() if i == 0 else (weights * ent).sum()).backward()
        out.append(x.grad)
    return out[0], out[1]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1024, 3], ids=["one-chunk", "chunked"])
@pytest.mark.parametrize("n_vocab,padded", [(13, 13), (13, 16), (5, 16)], ids=["unpadded", "padded", "mostly-pad"])
def test_one_rank_matches_log_softmax(temperature, chunk, n_vocab, padded):
    logits, targets, weights = case_tensors(10, padded, n_vocab, seed=1)
    lp, ent = vocab.logprobs_entropy(logits, targets, n_vocab, 0, None, temperature, with_entropy=True, chunk=chunk)
    ref_lp, ref_ent = reference(logits, targets, n_vocab, temperature)
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == ent.shape == (10,)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-6)
    lp_only, none = vocab.logprobs_entropy(logits, targets, n_vocab, 0, None, temperature, chunk=chunk)
    assert none is None and torch.equal(lp_only, lp)

    g_lp, g_ent = grads(lambda x: vocab.logprobs_entropy(x, targets, n_vocab, 0, None, temperature, True, chunk),
                        logits, targets, weights)
    r_lp, r_ent = grads(lambda x: reference(x, targets, n_vocab, temperature), logits, targets, weights)
    for g, r in ((g_lp, r_lp), (g_ent, r_ent)):
        assert torch.isfinite(g).all()
        assert torch.count_nonzero(g[:, n_vocab:]) == 0  # padding columns get no gradient
        torch.testing.assert_close(g, r, rtol=0, atol=1e-6)


def test_one_rank_low_precision_logits_and_empty_batch():
    logits, targets, _ = case_tensors(6, 16, 13, seed=2)
    lp, ent = vocab.logprobs_entropy(logits.bfloat16(), targets, 13, 0, None, with_entropy=True)
    ref_lp, ref_ent = reference(logits.bfloat16(), targets, 13, 1.0)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    lp, ent = vocab.logprobs_entropy(logits[:0], targets[:0], 13, 0, None, with_entropy=True)
    assert lp.shape == ent.shape == (0,)


CASES = [
    # rank 1's half holds 3 padding columns
    {"t": 9, "padded": 16, "vocab": 13, "seed": 3, "temperature": 0.7, "chunk": 4},
    # rank 1's half is all padding (a tiny vocabulary padded to a multiple of 128 * tp)
    {"t": 5, "padded": 16, "vocab": 7, "seed": 4, "temperature": 1.0, "chunk": 1024},
    # no padding
    {"t": 7, "padded": 12, "vocab": 12, "seed": 5, "temperature": 1.3, "chunk": 2},
]


def test_two_ranks_match_the_full_softmax():
    from rlweave.testing.ranks import run_ranks

    vocab_parallel_scenario = _scenarios.vocab_parallel_scenario

    ranks = run_ranks(vocab_parallel_scenario, 2, CASES, timeout_s=300)
    assert [r[0]["rank"] for r in ranks] == [0, 1]
    for i, c in enumerate(CASES):
        logits, targets, weights = case_tensors(c["t"], c["padded"], c["vocab"], c["seed"])
        ref_lp, ref_ent = reference(logits, targets, c["vocab"], c["temperature"])
        r_lp, r_ent = grads(lambda x, t=targets, c=c: reference(x, t, c["vocab"], c["temperature"]), logits, targets,
                            weights)
        n = c["padded"] // 2
        for tp_rank in range(2):
            res = ranks[tp_rank][i]
            torch.testing.assert_close(res["lp"], ref_lp, rtol=0, atol=1e-6)  # the same loss on both ranks
            torch.testing.assert_close(res["ent"], ref_ent, rtol=0, atol=1e-6)
            cols = slice(tp_rank * n, (tp_rank + 1) * n)
            # each rank's gradient is its columns of the full gradient (not summed over ranks)
            torch.testing.assert_close(res["grad_lp"], r_lp[:, cols], rtol=0, atol=1e-6)
            torch.testing.assert_close(res["grad_ent"], r_ent[:, cols], rtol=0, atol=1e-6)
