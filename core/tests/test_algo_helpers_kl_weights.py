"""KL estimators (rlweave.algo_parts.kl) and rlweave.algo_helpers.weights against hand-computed values."""

import math

import pytest
import torch

from rlweave.algo_helpers.weights import token_weights
from rlweave.algo_parts.kl import k1, k2, k3, kl_value
from rlweave.algo_parts.spec import resolve
from rlweave.data.batch import Batch


def test_kl_estimators_hand_computed():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -1.0, -0.5])
    # r = ref - logp = [-0.5, 1.0, 0.0]
    assert k1(logp, ref).tolist() == pytest.approx([0.5, -1.0, 0.0])
    assert k2(logp, ref).tolist() == pytest.approx([0.125, 0.5, 0.0])
    assert k3(logp, ref).tolist() == pytest.approx([math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1, 0.0])
    assert (k3(logp, ref) >= 0).all()
    assert torch.isfinite(k3(torch.tensor([-100.0]), torch.tensor([0.0]))).all()
    # the estimators are named parts: the names resolve to these functions, an unknown one is refused
    assert resolve("kl", "k3").load() is k3
    with pytest.raises(ValueError, match="k4"):
        resolve("kl", "k4")


def test_kl_value_clamps_the_estimate():
    logp, ref = torch.tensor([-30.0, 0.0, -1.0]), torch.tensor([0.0, -30.0, -1.0])
    # k1 = logp - ref = [-30, 30, 0] -> clamped to +-10; None: unclamped
    assert kl_value(k1, logp, ref).tolist() == [-10.0, 10.0, 0.0]
    assert kl_value(k1, logp, ref, clamp=2.5).tolist() == [-2.5, 2.5, 0.0]
    assert kl_value(k1, logp, ref, clamp=None).tolist() == [-30.0, 30.0, 0.0]
    # k3 with r = 30 (clamped to 20 inside): exp(20) - 21, far above the clamp
    assert kl_value(k3, logp, ref)[0].item() == 10.0


def batch():
    # sample 0: 2 response tokens, sample 1: 1 response token, sample 2: 3 response tokens
    return Batch.from_sequences([[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11]], prompt_lens=[2, 2, 1])


def test_token_mean_weights():
    w = token_weights(batch(), "token_mean")
    assert w.tolist() == pytest.approx([0, 0, 1 / 6, 1 / 6, 0, 0, 1 / 6, 0, 1 / 6, 1 / 6, 1 / 6])
    assert float(w.sum()) == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["seq_mean", "seq_mean_token_mean"])
def test_seq_mean_weights(name):
    w = token_weights(batch(), name)  # seq_mean: the earlier name of seq_mean_token_mean
    assert w.tolist() == pytest.approx([0, 0, 1 / 6, 1 / 6, 0, 0, 1 / 3, 0, 1 / 9, 1 / 9, 1 / 9])
    # a per-token loss of 1 on sample k gives mean over samples: sum(w * l) = mean of per-sample means
    loss = torch.tensor([0, 0, 1.0, 3.0, 0, 0, 5.0, 0, 6.0, 6.0, 6.0])
    assert float((w * loss).sum()) == pytest.approx((2.0 + 5.0 + 6.0) / 3)


def test_seq_mean_skips_samples_without_trained_tokens_and_rejects_unknown():
    b = Batch.from_sequences([[1, 2], [3, 4]], prompt_lens=[2, 1])
    assert token_weights(b, "seq_mean").tolist() == pytest.approx([0, 0, 0, 1.0])
    empty = Batch.from_sequences([[1, 2]], prompt_lens=[2])
    assert token_weights(empty, "token_mean").sum() == 0
    assert token_weights(empty, "seq_mean").sum() == 0
    with pytest.raises(ValueError, match="seq_sum"):
        token_weights(b, "seq_sum")
