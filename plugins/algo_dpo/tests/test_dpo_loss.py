"""DPO loss variants against hand-computed values (beta = 0.5, two pairs).

Pair 0: chosen response log-probs [-0.5, -0.5] (sum -1, ref -1.5, log-ratio +0.5),
        rejected [-1, -1, -1] (sum -3, ref -2.5, log-ratio -0.5)  -> h = +1.0
Pair 1: chosen [-1, -1] (sum -2, ref -1, log-ratio -1.0),
        rejected [-0.25, -0.75] (sum -1, ref -1.5, log-ratio +0.5) -> h = -1.5
Every sample has a 2-token prompt whose second token has log-prob -7 (must be masked out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from rlweave_algo_dpo.loss import DPOLoss, sequence_logps
from rlweave_algo_dpo.pairs import build_pair_batch, pair_minibatches

RESP = [[-0.5, -0.5], [-1.0, -1.0, -1.0], [-1.0, -1.0], [-0.25, -0.75]]
REF = [-1.5, -2.5, -1.0, -1.5]


@dataclass
class Out:
    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


def make_batch():
    prompts = [[1, 2], [1, 2]]
    chosen = [[3, 4], [5, 6]]
    rejected = [[7, 8, 9], [10, 11]]
    b = build_pair_batch(prompts, chosen, rejected, ["a", "b"])
    b.add_sample("ref_logp", torch.tensor(REF))
    lp = torch.cat([torch.tensor([0.0, -7.0] + r) for r in RESP])
    return b, lp


def run(loss_fn, batch, lp):
    lp = lp.clone().requires_grad_(True)
    loss, metrics = loss_fn(Out(lp), batch)
    loss.backward()
    return float(loss.detach()), metrics, lp.grad


def test_batch_layout():
    b, _ = make_batch()
    assert b.ids == ["a/chosen", "a/rejected", "b/chosen", "b/rejected"]
    assert b.sample["pair_id"].tolist() == [0, 0, 1, 1]
    assert b.sample["is_chosen"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert b.sample["pair_weight"].tolist() == [0.5] * 4
    # sft weight: 4 chosen response tokens, 1/4 each, nothing elsewhere
    assert b.token["sft_weight"].tolist() == [0, 0, .25, .25] + [0] * 5 + [0, 0, .25, .25] + [0] * 4


def test_sequence_logps_sum_and_mean():
    b, lp = make_batch()
    assert sequence_logps(lp, b).tolist() == pytest.approx([-1.0, -3.0, -2.0, -1.0])
    assert sequence_logps(lp, b, average=True).tolist() == pytest.approx([-0.5, -1.0, -1.0, -0.5])


@pytest.mark.parametrize("kind,smooth,expected", [
    # -log sigmoid(0.5) = log(1+e^-0.5) = 0.474077; -log sigmoid(-0.75) = log(1+e^0.75) = 1.136871
    ("sigmoid", 0.0, (0.474077 + 1.136871) / 2),
    # 0.9*0.474077 + 0.1*log(1+e^0.5)=0.974077 ; 0.9*1.136871 + 0.1*log(1+e^-0.75)=0.386871
    ("conservative", 0.1, (0.9 * 0.474077 + 0.1 * 0.974077 + 0.9 * 1.136871 + 0.1 * 0.386871) / 2),
    # (h - 1/(2*0.5))^2: (1-1)^2 = 0 ; (-1.5-1)^2 = 6.25
    ("ipo", 0.0, (0.0 + 6.25) / 2),
    # max(0, 1 - 0.5h): 0.5 ; 1.75
    ("hinge", 0.0, (0.5 + 1.75) / 2),
])
def test_loss_values(kind, smooth, expected):
    b, lp = make_batch()
    loss, m, _ = run(DPOLoss(beta=0.5, loss_type=kind, label_smoothing=smooth), b, lp)
    assert loss == pytest.approx(expected, abs=1e-5)
    assert m["dpo_loss"] == pytest.approx(expected, abs=1e-5)
    assert m["rewards/chosen"] == pytest.approx(0.5 * (0.5 - 1.0) / 2)
    assert m["rewards/rejected"] == pytest.approx(0.5 * (-0.5 + 0.5) / 2)
    assert m["rewards/margin"] == pytest.approx(0.5 * (1.0 - 1.5) / 2)
    assert m["rewards/accuracy"] == pytest.approx(0.5)
    assert m["logps/chosen"] == pytest.approx((-1.0 - 2.0) / 2)
    assert m["logps/rejected"] == pytest.approx((-3.0 - 1.0) / 2)
    assert m["pairs"] == 2


def test_sigmoid_gradient_by_hand():
    b, lp = make_batch()
    _, _, g = run(DPOLoss(beta=0.5), b, lp)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    g0 = -0.5 * 0.5 * sig(-0.5)   # weight * d/dh[-log sigmoid(beta h)] for pair 0
    g1 = -0.5 * 0.5 * sig(0.75)
    expected = [0, 0, g0, g0] + [0, 0, -g0, -g0, -g0] + [0, 0, g1, g1] + [0, 0, -g1, -g1]
    assert g.tolist() == pytest.approx(expected, abs=1e-6)


def test_sft_term_and_average():
    b, lp = make_batch()
    base, _, _ = run(DPOLoss(beta=0.5), b, lp)
    loss, m, _ = run(DPOLoss(beta=0.5, sft_coef=0.2), b, lp)
    # NLL token mean over the 4 chosen response tokens: (0.5+0.5+1+1)/4 = 0.75
    assert m["sft_nll"] == pytest.approx(0.75)
    assert loss == pytest.approx(base + 0.2 * 0.75, abs=1e-6)
    # average_logprobs: means -0.5,-1.0,-1.0,-0.5 with refs -> h0 = (1.0) - (1.5) = -0.5, h1 = 0 - 1.0 = -1
    loss, _, _ = run(DPOLoss(beta=0.5, average_logprobs=True), b, lp)
    expected = (math.log1p(math.exp(0.25)) + math.log1p(math.exp(0.5))) / 2
    assert loss == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("kind", ["sigmoid", "ipo"])
def test_split_pairs_give_same_loss_and_gradient(kind):
    """Micro-batches that split a pair, with partner log-ratios supplied, sum to the full
    batch's loss and gradient; metrics are counted once per pair."""
    fn = DPOLoss(beta=0.5, loss_type=kind, sft_coef=0.1)
    b, lp = make_batch()
    full_loss, full_m, full_g = run(fn, b, lp)
    lr = (sequence_logps(lp, b) - b.sample["ref_logp"]).detach()
    b.add_sample("partner_logratio", lr.view(-1, 2).flip(1).reshape(-1))
    parts = [[0], [1, 2], [3]]  # pair 0 split, pair 1 split
    total_loss, total_g = 0.0, torch.zeros_like(lp)
    sums: dict[str, float] = {}
    starts = b.cu_seqlens.tolist()
    for idx in parts:
        sub = b.select(idx)
        tok = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in idx])
        loss, m, g = run(fn, sub, lp[tok])
        total_loss += loss
        total_g[tok] += g
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + v
    assert total_loss == pytest.approx(full_loss, abs=1e-6)
    assert total_g.tolist() == pytest.approx(full_g.tolist(), abs=1e-6)
    for k in full_m:
        assert sums[k] == pytest.approx(full_m[k], abs=1e-6), k


def test_split_pair_without_partner_field_raises():
    b, lp = make_batch()
    with pytest.raises(ValueError, match="without its pair partner"):
        DPOLoss()(Out(lp[:4]), b.select([0]))


def test_empty_micro_batch_and_bad_config():
    b, lp = make_batch()
    loss, m = DPOLoss()(Out(torch.zeros(0, requires_grad=True)), b.select([]))
    assert float(loss.detach()) == 0.0 and m["pairs"] == 0
    with pytest.raises(ValueError, match="loss_type"):
        DPOLoss(loss_type="kto")
    with pytest.raises(ValueError, match="label_smoothing > 0"):
        DPOLoss(loss_type="conservative")
    with pytest.raises(ValueError, match="beta"):
        DPOLoss(beta=0)


def test_minibatches_keep_pairs_and_reweight():
    b, _ = make_batch()
    mbs = pair_minibatches(b, 2)
    assert [m.ids for m in mbs] == [["a/chosen", "a/rejected"], ["b/chosen", "b/rejected"]]
    for m in mbs:
        assert m.sample["pair_weight"].tolist() == [1.0, 1.0]
        assert float(m.token["sft_weight"].sum()) == pytest.approx(1.0)


def test_loss_is_picklable():
    import pickle

    fn = DPOLoss(beta=0.2, loss_type="ipo")
    assert pickle.loads(pickle.dumps(fn)) == fn


def test_cosine_schedule_length_counts_epochs_and_mini_batches():
    """The run's optimizer steps per step (the length of a cosine schedule) are the policy's
    epochs x mini_batches for both DPO algorithms (DPO names its passes ``epochs``)."""
    from rlweave_algo_dpo.config import DPOConfig, OnlineDPOConfig
    from rlweave_algo_dpo.dpo import DPO
    from rlweave_algo_dpo.online_dpo import OnlineDPO

    assert DPO.optimizer_steps_per_step(DPOConfig(epochs=3, mini_batches=2), "policy") == 6
    assert OnlineDPO.optimizer_steps_per_step(OnlineDPOConfig(epochs=2, mini_batches=4), "policy") == 8
