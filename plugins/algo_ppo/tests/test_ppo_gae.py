"""GAE and token rewards (rlweave.algo_parts.advantages) against hand-computed values (packed
batches, masking at the end)."""

import math

import pytest
import torch

from rlweave.algo_parts.advantages import gae, last_response_index, token_level_rewards
from rlweave.algo_parts.spec import resolve
from rlweave.data.batch import Batch


def _batch():
    # sample 0: 2 prompt + 3 response tokens; sample 1: 1 prompt + 2 response tokens
    return Batch.from_sequences([[5, 6, 7, 8, 9], [5, 7, 8]], prompt_lens=[2, 1])


def _gae(b, scores, token_rewards, values, gamma, lam):
    return gae(scores=torch.tensor(scores), mask=b.token["loss_mask"], cu_seqlens=b.cu_seqlens,
               token_rewards=token_rewards, values=values, gamma=gamma, lam=lam)


def test_last_response_index_and_token_rewards():
    b = _batch()
    mask = b.token["loss_mask"]
    assert mask.tolist() == [0, 0, 1, 1, 1, 0, 1, 1]
    assert last_response_index(mask, b.cu_seqlens).tolist() == [4, 7]
    kl = torch.tensor([9.0, 9.0, 0.1, 0.2, 0.3, 9.0, 1.0, -1.0])
    # the KL penalty -0.5 * KL on every response token (the prompt's 9s are ignored), the score on the last one
    r = token_level_rewards(torch.tensor([1.0, 2.0]), mask, b.cu_seqlens, token_rewards=-0.5 * kl)
    want = [0, 0, -0.05, -0.1, -0.15 + 1.0, 0, -0.5, 0.5 + 2.0]
    assert r.tolist() == pytest.approx(want)


def test_gae_hand_computed():
    b = _batch()
    # prompt positions carry junk that must be ignored (incl. 100 right after sample 0 ends)
    values = torch.tensor([7.0, 7.0, 0.5, 0.2, -0.1, 100.0, 0.3, 0.6])
    tok = torch.tensor([3.0, 3.0, 0.0, 0.0, 0.0, 3.0, -0.1, 0.0])
    # per-token rewards: sample 0 (0, 0, 1.0), sample 1 (-0.1, 0.5): scores 1.0 and 0.5 on the last tokens
    adv, ret = _gae(b, [1.0, 0.5], tok, values, gamma=0.9, lam=0.8)
    # sample 0 by hand (V after the last token is 0):
    #   t2: d = 1.0 + 0 - (-0.1) = 1.1           A = 1.1
    #   t1: d = 0 + 0.9*-0.1 - 0.2 = -0.29       A = -0.29 + 0.72*1.1 = 0.502
    #   t0: d = 0 + 0.9*0.2 - 0.5 = -0.32        A = -0.32 + 0.72*0.502 = 0.04144
    # sample 1: t1: d = 0.5 - 0.6 = -0.1; t0: d = -0.1 + 0.54 - 0.3 = 0.14, A = 0.14 - 0.072 = 0.068
    assert adv.tolist() == pytest.approx([0, 0, 0.04144, 0.502, 1.1, 0, 0.068, -0.1], abs=1e-6)
    assert ret.tolist() == pytest.approx([0, 0, 0.54144, 0.702, 1.0, 0, 0.368, 0.5], abs=1e-6)


def test_gae_gamma_lambda_one_is_reward_to_go_minus_value():
    b = _batch()
    values = torch.tensor([0, 0, 0.5, 0.2, -0.1, 0, 0.3, 0.6])
    tok = torch.tensor([0, 0, 0.1, 0.2, 0.0, 0, -0.1, 0.0])
    adv, ret = _gae(b, [1.0, 0.5], tok, values, gamma=1.0, lam=1.0)
    assert adv.tolist() == pytest.approx([0, 0, 1.3 - 0.5, 1.2 - 0.2, 1.0 + 0.1, 0, 0.4 - 0.3, 0.5 - 0.6], abs=1e-6)
    assert ret.tolist() == pytest.approx([0, 0, 1.3, 1.2, 1.0, 0, 0.4, 0.5], abs=1e-6)


def _reference_gae(scores, tok, values, mask, cu, gamma, lam):
    adv = [0.0] * len(mask)
    for i, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        pos = [t for t in range(s, e) if mask[t] > 0]
        last = 0.0
        for k in range(len(pos) - 1, -1, -1):
            t = pos[k]
            r = tok[t].item() + (scores[i].item() if k == len(pos) - 1 else 0.0)
            nv = values[pos[k + 1]].item() if k + 1 < len(pos) else 0.0
            d = r + gamma * nv - values[t].item()
            last = d + gamma * lam * last
            adv[t] = last
    return torch.tensor(adv)


def test_gae_matches_reference_loop_on_random_batch():
    g = torch.Generator().manual_seed(0)
    lens = [7, 3, 12, 2, 9]
    seqs = [list(range(1, n + 1)) for n in lens]
    b = Batch.from_sequences(seqs, prompt_lens=[3, 1, 4, 2, 8])  # sample 3 has no response token
    mask = b.token["loss_mask"]
    T = b.num_tokens
    scores, tok, values = torch.randn(5, generator=g), torch.randn(T, generator=g), torch.randn(T, generator=g)
    adv, ret = gae(scores=scores, mask=mask, cu_seqlens=b.cu_seqlens, token_rewards=tok, values=values,
                   gamma=0.97, lam=0.9)
    want = _reference_gae(scores, tok, values, mask, b.cu_seqlens, 0.97, 0.9)
    assert torch.allclose(adv, want, atol=1e-5)
    assert torch.allclose(ret, (want + values) * mask, atol=1e-5)
    assert not math.isnan(float(adv.sum()))
    # no response token -> nothing anywhere in that sample
    s, e = b.cu_seqlens[3].item(), b.cu_seqlens[4].item()
    assert adv[s:e].abs().sum() == 0 and ret[s:e].abs().sum() == 0


def test_gae_needs_values_and_resolves_with_its_options():
    b = _batch()
    with pytest.raises(ValueError, match="needs a critic's values"):
        gae(scores=torch.zeros(2), mask=b.token["loss_mask"], cu_seqlens=b.cu_seqlens)
    part = resolve("advantage", {"name": "gae", "gamma": 0.9, "lam": 0.8})
    assert part.load() is gae and part.options == {"gamma": 0.9, "lam": 0.8} and part.needs == ("values",)
    with pytest.raises(ValueError, match="lam"):
        resolve("advantage", {"name": "gae", "lam": 1.5})
