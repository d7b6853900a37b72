"""Bradley-Terry loss, ranked-pair expansion, and exactness of the linearised RM step."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlweave.data.batch import Batch
from rlweave_algo_sft.rm_loss import ScoreGradLoss, bradley_terry_loss, bt_loss_and_grads, live_scores, with_score_slot
from rlweave_algo_sft.rm_pairs import record_pairs, records_to_pairs, ranked_pairs


def test_bradley_terry_hand_computed():
    c, r = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0])
    assert bradley_terry_loss(c, r).tolist() == pytest.approx([math.log(1 + math.exp(-2)), math.log(2)])
    # margin 1: -log sigmoid(2 - 0 - 1) = log(1 + e^-1)
    assert float(bradley_terry_loss(c[:1], r[:1], 1.0)) == pytest.approx(0.3132617)


def test_bt_loss_and_grads_hand_computed():
    scores = torch.tensor([2.0, 0.0, 1.0])
    # pairs: (0 > 1) margin 1, (2 > 1) margin 0; weights 1/2
    loss, g, acc = bt_loss_and_grads(scores, torch.tensor([0, 2]), torch.tensor([1, 1]), torch.tensor([1.0, 0.0]))
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert loss == pytest.approx(0.5 * math.log(1 + math.exp(-1)) + 0.5 * math.log(1 + math.exp(-1)))
    # dL/ds_c = -w (1 - sigmoid(d)); dL/ds_r = +w (1 - sigmoid(d)); score 1 is rejected twice
    assert g.tolist() == pytest.approx([-0.5 * (1 - sig(1)), 0.5 * (1 - sig(1)) * 2, -0.5 * (1 - sig(1))], abs=1e-6)
    assert acc == 1.0
    _, _, acc2 = bt_loss_and_grads(torch.tensor([0.0, 1.0]), torch.tensor([0]), torch.tensor([1]))
    assert acc2 == 0.0


def test_ranked_pairs_all_ordered_pairs_ties_skipped():
    assert ranked_pairs([1, 3, 3, 0]) == [(0, 3), (1, 0), (1, 3), (2, 0), (2, 3)]
    pairs = record_pairs({"id": "7", "query": "q", "response": ["a", "b", "c"], "score": [0.5, 2.0, 0.5]},
                         margin_from_scores=True)
    assert [(p.chosen, p.rejected, p.margin) for p in pairs] == [("b", "a", 1.5), ("b", "c", 1.5)]
    pw = records_to_pairs([{"prompt": "p", "chosen": "x", "rejected": "y"}, {"query": "q", "chosen": "u", "rejected": "v", "margin": 2}])
    assert [(p.prompt, p.chosen, p.rejected, p.margin) for p in pw] == [("p", "x", "y", 0.0), ("q", "u", "v", 2.0)]


def test_pair_record_errors_name_record():
    with pytest.raises(ValueError, match="record 3: 2 responses but 1 scores"):
        record_pairs({"id": 3, "query": "q", "response": ["a", "b"], "score": [1]})
    with pytest.raises(ValueError, match="record 4: needs 'prompt'"):
        record_pairs({"id": 4, "chosen": "a", "rejected": "b"})
    with pytest.raises(ValueError, match="'rejected' must be a string"):
        record_pairs({"id": 5, "prompt": "p", "chosen": "a"})


def test_linearised_step_has_the_exact_bt_gradient_under_any_split():
    """A tiny scalar 'model' (head at token t = sum of embeddings up to t). Gradient of the
    direct BT loss == summed ScoreGradLoss gradients over a split that separates pair
    members (as token-budget micro-batching or dp scatter may), reading the scores from
    prediction-aligned values on sequences extended by a slot token."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(20, 1)
    seqs = [[1, 2, 3], [1, 4], [5, 6, 7, 8], [9, 2]]
    ci, ri, m = torch.tensor([0, 2, 0]), torch.tensor([1, 3, 3]), torch.tensor([0.0, 0.5, 0.0])

    def raw(batch):  # head output at each position: running sum inside each sample
        per_tok = emb(batch.token["input_ids"]).squeeze(-1)
        return torch.cat([torch.cumsum(x, 0) for x in per_tok.split(batch.seqlens.tolist())])

    def scores(batch):  # what compute_scores returns: the head at each sample's last token
        return raw(batch)[batch.cu_seqlens[1:] - 1]

    def values(batch):  # prediction convention: values[t] = head at t-1, 0 at sample starts
        r = raw(batch)
        v = torch.cat([r.new_zeros(1), r[:-1]])
        return v.masked_fill(torch.zeros_like(v, dtype=torch.bool).index_fill(0, batch.cu_seqlens[:-1], True), 0.0)

    b = Batch.from_sequences(seqs)
    direct = (bradley_terry_loss(scores(b)[ci], scores(b)[ri], m) / 3).sum()
    want = torch.autograd.grad(direct, emb.weight)[0]

    with torch.no_grad():
        s = scores(b)
    loss, g, _ = bt_loss_and_grads(s, ci, ri, m)
    assert loss == pytest.approx(float(direct.detach()))
    tb = Batch.from_sequences(with_score_slot(seqs, 0))
    tb.add_sample("score_grad", g)
    assert torch.allclose(live_scores(SimpleNamespace(values=values(tb)), tb), s)
    total = torch.zeros_like(emb.weight)
    for part in (tb.select([0, 3]), tb.select([1]), tb.select([2])):  # pairs split apart
        sl, _ = ScoreGradLoss()(SimpleNamespace(values=values(part)), part)
        total += torch.autograd.grad(sl, emb.weight)[0]
    assert torch.allclose(total, want, atol=1e-6)
