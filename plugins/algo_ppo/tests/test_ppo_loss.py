"""PPO's losses against hand-computed values: the policy objective as PPO builds it
(PolicyObjective with the ppo_clip policy loss, entropy bonus and ptx term, no KL term: PPO's
KL is in the reward) and the value loss."""

import math
import pickle
from types import SimpleNamespace

import pytest
import torch

from rlweave.algo_parts.objective import PolicyObjective
from rlweave.algo_parts.spec import resolve
from rlweave.data.batch import Batch
from rlweave_algo_ppo.loss import ValueLoss


def policy_loss(clip_low=0.2, clip_high=0.2, **kw):
    pl = resolve("policy_loss", {"name": "ppo_clip", "clip_low": clip_low, "clip_high": clip_high})
    return PolicyObjective(policy_loss=pl, **kw)

def _batch(**token):
    b = Batch.from_sequences([[1, 2, 3]], prompt_lens=[1])  # two response tokens
    for k, v in token.items():
        b.add_token(k, torch.tensor(v, dtype=torch.float32))
    return b


def _policy_case(ratios):
    logp = torch.tensor([0.0] + [math.log(r) for r in ratios], requires_grad=True)
    b = _batch(advantages=[0.0, 1.0, -1.0], old_logprobs=[0.0, 0.0, 0.0], token_weight=[0.0, 0.5, 0.5])
    return logp, b


def test_policy_loss_clipped_branch():
    logp, b = _policy_case([1.5, 0.5])
    loss, m = policy_loss(clip_low=0.2, clip_high=0.2)(SimpleNamespace(logprobs=logp, entropy=None), b)
    # token1: A=1, r=1.5: max(-1.5, -1.2) = -1.2 (clipped); token2: A=-1, r=0.5: max(0.5, 0.8) = 0.8 (clipped)
    assert float(loss.detach()) == pytest.approx(0.5 * -1.2 + 0.5 * 0.8)
    assert m["clip_frac"] == pytest.approx(1.0)
    # ppo_kl: k3 estimate of KL(old || new), 1/r + log(r) - 1 per token
    assert m["ppo_kl"] == pytest.approx(0.5 * (1 / 1.5 + math.log(1.5) - 1) + 0.5 * (2 + math.log(0.5) - 1))
    loss.backward()
    assert logp.grad.abs().sum() == 0  # both tokens clipped: no gradient


def test_policy_loss_unclipped_gradient_and_clip_higher():
    logp, b = _policy_case([1.1, 0.9])
    loss, m = policy_loss(clip_low=0.2, clip_high=0.2)(SimpleNamespace(logprobs=logp, entropy=None), b)
    assert float(loss.detach()) == pytest.approx(0.5 * -1.1 + 0.5 * 0.9)
    assert m["clip_frac"] == 0.0
    assert m["ratio"] == pytest.approx(1.0)
    loss.backward()
    # d/dlogp of w * (-A * ratio) = -w * A * ratio
    assert logp.grad.tolist() == pytest.approx([0.0, -0.55, 0.45])
    # clip-higher: ratio 1.5 with A>0 is inside [0.8, 1.6] when clip_high=0.6
    logp2, b2 = _policy_case([1.5, 0.5])
    loss2, _ = policy_loss(clip_low=0.2, clip_high=0.6)(SimpleNamespace(logprobs=logp2, entropy=None), b2)
    assert float(loss2.detach()) == pytest.approx(0.5 * -1.5 + 0.5 * 0.8)


def test_policy_loss_entropy_and_ptx():
    logp = torch.tensor([0.0, math.log(0.5), math.log(0.25)], requires_grad=True)
    b = _batch(advantages=[0.0, 0.0, 0.0], old_logprobs=[0.0, math.log(0.5), 0.0],
               token_weight=[0.0, 1.0, 0.0], ptx_weight=[0.0, 0.0, 1.0])
    ent = torch.tensor([0.0, 2.0, 3.0])
    loss, m = policy_loss(entropy_coef=0.1, ptx_coef=0.5)(SimpleNamespace(logprobs=logp, entropy=ent), b)
    # pg = 0 (A = 0); entropy bonus -0.1*2.0; ptx 0.5 * -log(0.25)
    assert float(loss.detach()) == pytest.approx(-0.2 + 0.5 * math.log(4))
    assert m["ptx_loss"] == pytest.approx(math.log(4))
    assert m["entropy"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no entropy"):
        policy_loss(entropy_coef=0.1)(SimpleNamespace(logprobs=logp, entropy=None), b)


def test_policy_loss_missing_field_and_empty_batch_and_pickle():
    logp = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss()(SimpleNamespace(logprobs=logp, entropy=None), _batch(token_weight=[0, 1, 1]))
    empty = torch.zeros(0, requires_grad=True)
    loss, _ = policy_loss()(SimpleNamespace(logprobs=empty, entropy=None), None)
    assert float(loss.detach()) == 0.0 and loss.requires_grad
    assert pickle.loads(pickle.dumps(policy_loss(0.1, 0.3))) == policy_loss(0.1, 0.3)


def test_value_loss_hand_computed():
    v = torch.tensor([9.0, 1.0, 0.0], requires_grad=True)
    b = _batch(old_values=[0.0, 0.5, 0.0], returns=[0.0, 2.0, 1.0], token_weight=[0.0, 0.5, 0.5])
    loss, m = ValueLoss(clip_eps=0.2)(SimpleNamespace(logprobs=None, entropy=None, values=v), b)
    # token1: max((1-2)^2, (0.7-2)^2) = 1.69 -> 0.845; token2: max(1, 1) -> 0.5
    assert float(loss.detach()) == pytest.approx(0.5 * 0.845 + 0.5 * 0.5)
    assert m["value_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    # token1 uses the clipped branch (constant in v): no grad; token2: w * (v - R) = 0.5 * -1
    assert v.grad.tolist() == pytest.approx([0.0, 0.0, -0.5])
    v2 = torch.tensor([9.0, 1.0, 0.0])
    loss2, _ = ValueLoss(clip_eps=None)(SimpleNamespace(values=v2), b)
    assert float(loss2.detach()) == pytest.approx(0.5 * 0.5 * 1.0 + 0.5 * 0.5 * 1.0)


def test_value_loss_needs_values():
    with pytest.raises(ValueError, match="model_type must be 'value'"):
        ValueLoss()(SimpleNamespace(logprobs=torch.zeros(3)), _batch())
