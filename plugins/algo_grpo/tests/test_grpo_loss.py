"""GRPO's loss (rlweave.algo_parts.objective.PolicyObjective with the ppo_clip policy loss and a
KL estimator) against a hand-computed case: clipped surrogate with clip-higher, KL term,
gradients, metrics and picklability."""

import math
import pickle
from dataclasses import dataclass

import pytest
import torch

from rlweave.algo_parts.objective import PolicyObjective
from rlweave.algo_parts.spec import resolve
from rlweave.data.batch import Batch


@dataclass
class Out:
    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


def objective(clip_low=0.2, clip_high=0.2, **kw):
    """GRPO's objective as its config builds it: ppo_clip with these ranges, the k3 estimator."""
    pl = resolve("policy_loss", {"name": "ppo_clip", "clip_low": clip_low, "clip_high": clip_high})
    return PolicyObjective(policy_loss=pl, kl=resolve("kl", "k3"), **kw)


def make_batch():
    # one sample: prompt token + 4 response tokens
    b = Batch.from_sequences([[1, 2, 3, 4, 5]], prompt_lens=[1])
    b.add_token("token_weight", torch.tensor([0.0, 0.25, 0.25, 0.25, 0.25]))
    b.add_token("advantages", torch.tensor([0.0, 1.0, 1.0, -1.0, -1.0]))
    b.add_token("old_logprobs", torch.zeros(5))
    return b


RATIOS = [1.0, 1.5, 0.9, 1.5, 0.5]


def test_clipped_surrogate_value_gradient_and_clip_fraction():
    lp = torch.log(torch.tensor(RATIOS)).requires_grad_(True)
    loss, m = objective(clip_low=0.2, clip_high=0.28)(Out(lp), make_batch())
    # token-wise pg: -1.28 (clipped high), -0.9, +1.5, +0.8 (clipped low); weights 1/4
    assert loss.item() == pytest.approx(0.25 * (-1.28 - 0.9 + 1.5 + 0.8), rel=1e-5)
    assert m["clip_frac"] == pytest.approx(0.5)
    assert m["pg_loss"] == pytest.approx(loss.item(), rel=1e-6)
    assert m["ratio"] == pytest.approx(0.25 * (1.5 + 0.9 + 1.5 + 0.5))
    assert m["weight"] == pytest.approx(1.0) and m["tokens_trained"] == 4.0
    loss.backward()
    # d/dlogp of -ratio*A*w = -A*ratio*w on unclipped tokens, 0 on clipped ones
    assert lp.grad.tolist() == pytest.approx([0.0, 0.0, -0.9 * 0.25, 1.5 * 0.25, 0.0])


def test_without_old_logprobs_ratio_is_one_and_gradient_is_policy_gradient():
    b = make_batch()
    del b.token["old_logprobs"]
    lp = torch.log(torch.tensor(RATIOS)).requires_grad_(True)
    loss, m = objective()(Out(lp), b)
    assert loss.item() == pytest.approx(0.0)  # sum of w*(-A) = 0.25*(-1-1+1+1)
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([0.0, -0.25, -0.25, 0.25, 0.25])
    assert m["clip_frac"] == 0.0 and m["ratio"] == pytest.approx(1.0) and m["ppo_kl"] == 0.0


def test_kl_term_k3_and_entropy_and_gap_metrics():
    b = make_batch()
    b.add_token("ref_logprobs", torch.zeros(5))
    b.add_token("rollout_logprobs", torch.full((5,), -0.1))
    lp = torch.log(torch.tensor(RATIOS))
    ent = torch.tensor([9.0, 1.0, 2.0, 3.0, 4.0])
    loss, m = objective(clip_low=0.2, clip_high=0.28, kl_beta=0.1)(Out(lp, ent), b)
    # k3 with r = ref - logp = -log(ratio): exp(r) - r - 1 = 1/ratio + log(ratio) - 1
    kl = [1 / x + math.log(x) - 1 for x in RATIOS[1:]]
    assert m["kl"] == pytest.approx(0.25 * sum(kl))
    assert loss.item() == pytest.approx(0.25 * (-1.28 - 0.9 + 1.5 + 0.8) + 0.1 * 0.25 * sum(kl), rel=1e-5)
    assert m["entropy"] == pytest.approx(2.5)
    assert m["logprob_gap"] == pytest.approx(0.25 * sum(abs(math.log(x) + 0.1) for x in RATIOS[1:]))
    # each token's KL estimate is clamped to kl_clamp: 0.0721, 0.00575, 0.0721, 0.307 -> 0.01, 0.00575, 0.01, 0.01
    _, m = objective(kl_beta=0.1, kl_clamp=0.01)(Out(lp, ent), b)
    assert m["kl"] == pytest.approx(0.25 * (0.03 + 1 / 0.9 + math.log(0.9) - 1), rel=1e-5)


def test_loss_is_picklable():
    fn = pickle.loads(pickle.dumps(objective(clip_high=0.28, kl_beta=0.04)))
    assert fn.policy_loss.options["clip_high"] == 0.28 and fn.kl_beta == 0.04 and fn.kl.name == "k3"
