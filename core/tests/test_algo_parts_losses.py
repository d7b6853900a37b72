"""Policy losses, loss aggregations, KL estimators and the policy objective of
rlweave.algo_parts against hand-computed fp64 values, with gradient checks."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlweave.algo_parts import aggregation as G
from rlweave.algo_parts import kl as K
from rlweave.algo_parts import policy_losses as P
from rlweave.algo_parts.objective import PolicyObjective
from rlweave.algo_parts.spec import resolve
from rlweave.data.batch import Batch

D = torch.float64


def leaf(values):
    return torch.tensor(values, dtype=D, requires_grad=True)


def test_ppo_clip_values_and_gradients():
    ratios, adv = [1.5, 0.5, 1.1], [1.0, -1.0, 2.0]
    old = torch.zeros(3, dtype=D)
    logp = leaf([math.log(r) for r in ratios])
    loss, info = P.ppo_clip(logp, old, torch.tensor(adv, dtype=D), clip_low=0.2, clip_high=0.28)
    # t0: max(-1.5, -1.28) = -1.28 (clipped); t1: max(0.5, 0.8) = 0.8 (clipped); t2: -2.2
    assert loss.tolist() == pytest.approx([-1.28, 0.8, -2.2])
    assert info["clipped"].tolist() == [1.0, 1.0, 0.0]
    loss.sum().backward()
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, -2.2])  # d(-A r)/dlogp = -A r


def test_ppo_dual_clip_bounds_negative_advantages():
    logp = leaf([math.log(5.0), math.log(5.0)])
    loss, info = P.ppo_clip(logp, torch.zeros(2, dtype=D), torch.tensor([-1.0, 1.0], dtype=D), clip_low=0.2,
                            clip_high=0.2, dual_clip=3.0)
    # A = -1, r = 5: max(5, 1.2) = 5, bounded by -A * 3 = 3; A = 1: max(-5, -1.2) = -1.2
    assert loss.tolist() == pytest.approx([3.0, -1.2])
    assert info["clipped"].tolist() == [1.0, 1.0]
    loss.sum().backward()
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0])


def test_gspo_uses_the_geometric_mean_ratio_of_each_sequence():
    # two sequences: tokens 0-2 (token 0 untrained), tokens 3-4
    cu = torch.tensor([0, 3, 5])
    mask = torch.tensor([0.0, 1, 1, 1, 1], dtype=D)
    old = torch.zeros(5, dtype=D)
    logp = leaf([9.0, 0.2, -0.1, 0.3, 0.1])  # token 0 is off the mask: it must not count
    adv = torch.tensor([0.0, 1.0, 1.0, -2.0, -2.0], dtype=D)
    loss, info = P.gspo(logp, old, adv, mask=mask, cu_seqlens=cu, clip_low=0.5, clip_high=0.5)
    s1, s2 = math.exp(0.05), math.exp(0.2)
    assert info["ratio"][1:].tolist() == pytest.approx([s1, s1, s2, s2])
    assert loss[1:].tolist() == pytest.approx([-s1, -s1, 2 * s2, 2 * s2])
    (loss * mask).sum().backward()
    # value s_i, gradient s_i * A_t on each token (sequence ratio held fixed)
    assert logp.grad[1:].tolist() == pytest.approx([-s1, -s1, 2 * s2, 2 * s2])
    # a sequence with no trained token: ratio 1, finite (its weights are 0 in any aggregation)
    full, _ = P.gspo(leaf([0.5, 0.5]), torch.zeros(2, dtype=D), torch.ones(2, dtype=D),
                     mask=torch.zeros(2, dtype=D), cu_seqlens=torch.tensor([0, 2]))
    assert torch.isfinite(full).all() and full.tolist() == pytest.approx([-1.0, -1.0])
    # GSPO's own tight range clips the first sequence (ratio 1.051 > 1 + 4e-4, A > 0)
    loss2, info2 = P.gspo(logp.detach(), old, adv, mask=mask, cu_seqlens=cu)
    assert loss2[1:3].tolist() == pytest.approx([-(1 + 4e-4)] * 2)
    assert info2["clipped"][1:3].tolist() == [1.0, 1.0]


def test_cispo_clips_the_weight_and_keeps_every_gradient():
    logp = leaf([math.log(1.5), math.log(0.5)])
    adv = torch.tensor([1.0, 2.0], dtype=D)
    loss, info = P.cispo(logp, torch.zeros(2, dtype=D), adv, clip_high=0.28)
    assert loss.tolist() == pytest.approx([-1.28 * math.log(1.5), -0.5 * 2.0 * math.log(0.5)])
    assert info["clipped"].tolist() == [1.0, 0.0]
    loss.sum().backward()
    assert logp.grad.tolist() == pytest.approx([-1.28, -1.0])  # -sg(w) * A: the clipped token still moves


MASK = torch.tensor([0.0, 1, 1, 0, 1, 1, 1, 0, 0, 0, 1])  # samples of 3, 4, 2, 2 tokens; sample 2 untrained
CU = torch.tensor([0, 3, 7, 9, 11])


def test_aggregations_by_hand():
    L = [2, 3, 0, 1]
    n_valid, per_tok = 3, {0: [1, 2], 1: [4, 5, 6], 3: [10]}

    def expect(f):
        w = [0.0] * 11
        for i, toks in per_tok.items():
            for t in toks:
                w[t] = f(i)
        return w

    assert G.token_mean(MASK, CU).tolist() == pytest.approx(expect(lambda i: 1 / 6))
    assert G.seq_mean_token_mean(MASK, CU).tolist() == pytest.approx(expect(lambda i: 1 / (L[i] * n_valid)))
    assert G.seq_mean_token_sum(MASK, CU).tolist() == pytest.approx(expect(lambda i: 1 / n_valid))
    assert G.seq_mean_token_sum_norm(MASK, CU, max_len=8).tolist() == pytest.approx(expect(lambda i: 1 / (4 * 8)))
    assert G.seq_mean_token_sum_norm(MASK, CU, max_len=8, norm_len=2).tolist() == \
        pytest.approx(expect(lambda i: 1 / (4 * 2)))
    assert G.token_sum(MASK, CU).tolist() == expect(lambda i: 1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        G.seq_mean_token_sum_norm(MASK, CU)
    for fn in (G.token_mean, G.seq_mean_token_mean, G.seq_mean_token_sum, G.token_sum):
        assert fn(torch.zeros(11), CU).abs().sum().item() == 0.0
    assert G.seq_mean_token_sum_norm(torch.zeros(11), CU, max_len=4).abs().sum().item() == 0.0


def test_kl_estimators_and_clamp():
    logp, ref = torch.tensor([-1.0, -2.0], dtype=D), torch.tensor([-1.5, -0.5], dtype=D)
    r = [-0.5, 1.5]
    assert K.k1(logp, ref).tolist() == pytest.approx([0.5, -1.5])
    assert K.k2(logp, ref).tolist() == pytest.approx([x * x / 2 for x in r])
    assert K.k3(logp, ref).tolist() == pytest.approx([math.exp(x) - x - 1 for x in r])
    far = torch.tensor([-30.0], dtype=D)
    assert K.kl_value(K.k3, torch.zeros(1, dtype=D), -far, clamp=10.0).item() == 10.0
    assert K.kl_value(K.k3, torch.zeros(1, dtype=D), -far, clamp=None).item() > 1e8
    assert K.kl_value(K.k1, torch.zeros(1, dtype=D), -far, clamp=10.0).item() == -10.0
    ref1 = torch.tensor([-1.5], dtype=D)
    for fn, grad in ((K.k1, 1.0), (K.k2, 0.5), (K.k3, 1 - math.exp(-0.5))):  # r = ref - logp = -0.5
        lp = leaf([-1.0])
        fn(lp, ref1).sum().backward()
        assert lp.grad.item() == pytest.approx(grad), fn.__name__  # d/dlogp of -r, r^2/2, e^r - r - 1


def _batch(logp_old, adv, weight, ref=None):
    b = Batch.from_sequences([[1, 2, 3], [4, 5]], ids=["a", "b"], meta=[{}, {}], prompt_lens=[1, 1])
    b.add_token("old_logprobs", torch.tensor(logp_old))
    b.add_token("advantages", torch.tensor(adv))
    b.add_token("token_weight", torch.tensor(weight))
    if ref is not None:
        b.add_token("ref_logprobs", torch.tensor(ref))
    return b


def test_policy_objective_sums_weighted_policy_loss_and_kl():
    logp = torch.tensor([0.0, math.log(1.5), math.log(0.9), 0.0, math.log(1.1)], requires_grad=True)
    batch = _batch([0.0] * 5, [0.0, 1.0, -1.0, 0.0, 2.0], [0.0, 0.25, 0.25, 0.0, 0.5],
                   ref=[0.0, 0.0, 0.0, 0.0, 0.0])
    obj = PolicyObjective(resolve("policy_loss", {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.2}),
                          kl=resolve("kl", "k1"), kl_beta=0.1)
    out = SimpleNamespace(logprobs=logp, entropy=None, values=None)
    loss, m = obj(out, batch)
    pg = [0.0, -1.2, 0.9, 0.0, -2.2]  # t1 clipped at 1.2, t2 unclipped -A r = 0.9, t4 -2.2
    w = [0.0, 0.25, 0.25, 0.0, 0.5]
    kl = [0.0, math.log(1.5), math.log(0.9), 0.0, math.log(1.1)]
    assert loss.item() == pytest.approx(sum(a * b for a, b in zip(w, pg)) + 0.1 * sum(a * b for a, b in zip(w, kl)),
                                        rel=1e-6)
    assert m["clip_frac"] == pytest.approx(0.25) and m["weight"] == pytest.approx(1.0)
    assert m["tokens_trained"] == 3.0 and m["kl"] == pytest.approx(sum(a * b for a, b in zip(w, kl)), rel=1e-6)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([0.0, 0.1 * 0.25, 0.25 * (0.9 + 0.1), 0.0, 0.5 * (-2.2 + 0.1)],
                                               rel=1e-5)


def test_policy_objective_handles_an_empty_micro_batch():
    obj = PolicyObjective(resolve("policy_loss", "ppo_clip"))
    loss, m = obj(SimpleNamespace(logprobs=torch.zeros(0, requires_grad=True), entropy=None), None)
    assert loss.item() == 0.0 and m["pg_loss"] == 0.0


def test_off_policy_correction_composes_with_any_policy_loss():
    """tis multiplies each token's loss by min(pi_old / pi_behaviour, cap), whichever loss made it."""
    from rlweave.algo_parts.offpolicy import OffPolicyConfig

    w = [0.0, 0.25, 0.25, 0.0, 0.5]
    behav = [0.0, math.log(0.5), 0.0, 0.0, math.log(2.0)]  # iw = exp(0 - behav): 2.0 (capped 1.5), 1, 0.5
    coef = [1.0, 1.5, 1.0, 1.0, 0.5]
    for name in ("ppo_clip", "gspo", "cispo"):
        logp = torch.tensor([0.0, 0.1, -0.2, 0.0, 0.3], requires_grad=True)
        batch = _batch([0.0] * 5, [0.0, 1.0, -1.0, 0.0, 2.0], w)
        batch.add_token("rollout_logprobs", torch.tensor(behav))
        out = SimpleNamespace(logprobs=logp, entropy=None)
        plain, _ = PolicyObjective(resolve("policy_loss", name))(out, batch)
        corrected, m = PolicyObjective(resolve("policy_loss", name),
                                       off_policy=OffPolicyConfig(correction="tis", cap=1.5))(out, batch)
        part = resolve("policy_loss", name)
        pg, _ = part.load()(logp.detach(), torch.zeros(5), batch.token["advantages"], mask=batch.token["loss_mask"],
                            cu_seqlens=batch.cu_seqlens, **part.options)
        assert corrected.item() == pytest.approx(sum(a * b * c for a, b, c in zip(w, coef, pg.tolist())), rel=1e-5)
        assert plain.item() == pytest.approx(sum(a * c for a, c in zip(w, pg.tolist())), rel=1e-5), name
        assert "offpolicy/iw_mean" in m
