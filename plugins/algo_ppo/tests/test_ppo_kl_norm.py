"""KL controllers, advantage whitening, reward normalisation, explained variance, with the one
normalisation convention (rlweave.algo_parts.stats: float64, sample std, eps 1e-6 added to it,
all-equal values give exactly 0)."""

import math

import pytest
import torch

from rlweave.algo_parts.stats import masked_moments, masked_whiten
from rlweave.algo_parts.kl_controller import AdaptiveKLController, FixedKLController, make_kl_controller
from rlweave_algo_ppo.normalize import RunningMoments, explained_variance, normalize_scores


def test_fixed_kl_controller():
    c = make_kl_controller(0.05)
    assert isinstance(c, FixedKLController) and not isinstance(c, AdaptiveKLController)
    assert c.update(100.0, 64) == 0.05


def test_adaptive_kl_controller_ziegler():
    c = make_kl_controller(0.1, target=6.0, horizon=10000)
    # KL 9 -> error 0.5 clipped to 0.2; beta *= 1 + 0.2 * 64 / 10000
    assert c.update(9.0, 64) == pytest.approx(0.1 * 1.00128)
    c2 = AdaptiveKLController(0.1, 6.0, 10000)
    assert c2.update(3.0, 64) == pytest.approx(0.1 * (1 - 0.00128))
    c3 = AdaptiveKLController(0.1, 6.0, 100)
    assert c3.update(6.6, 10) == pytest.approx(0.1 * (1 + 0.1 * 10 / 100))
    fresh = AdaptiveKLController(1.0, 6.0, 100)
    fresh.load_state_dict(c3.state_dict())
    assert fresh.value == c3.value
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(0.1, 0.0, 100)


EPS = 1e-6  # the convention's eps, added to the sample std


def test_masked_whiten_global_stats():
    x = torch.tensor([1.0, 2.0, 3.0, 50.0])
    m = torch.tensor([1.0, 1.0, 1.0, 0.0])
    # mean 2, sample std sqrt((1 + 0 + 1) / 2) = 1
    assert masked_moments(x, m) == pytest.approx((2.0, 1.0))
    y = masked_whiten(x, m)
    a = 1 / (1 + EPS)
    assert y.tolist() == pytest.approx([-a, 0.0, a, 0.0], abs=1e-7)
    # whitening the whole batch is not whitening its halves: statistics are global
    halves = torch.cat([masked_whiten(x[:2], m[:2]), masked_whiten(x[2:], m[2:])])
    assert not torch.allclose(halves, y)
    y2 = masked_whiten(x, m, shift_mean=False)
    assert y2.tolist() == pytest.approx([-a + 2, 2.0, a + 2, 0.0], abs=1e-6)
    # all equal values on the mask (one value included): exactly 0, however the mean rounds
    assert masked_whiten(torch.tensor([3.3, 3.3, 3.3, 7.0]), m).tolist() == [0.0] * 4
    assert masked_moments(torch.tensor([3.3, 3.3, 3.3, 7.0]), m)[1] == 0.0
    assert masked_whiten(x, torch.tensor([0.0, 1.0, 0.0, 0.0])).tolist() == [0.0] * 4


def test_running_moments_and_score_normalisation():
    rm = RunningMoments()
    rm.update(torch.tensor([1.0, 2.0]))
    rm.update(torch.tensor([3.0, 4.0, 5.0]))
    # mean 3, sample variance (4 + 1 + 0 + 1 + 4) / 4 = 2.5
    assert rm.mean == pytest.approx(3.0) and rm.std == pytest.approx(math.sqrt(2.5))
    s = torch.tensor([0.0, 10.0])
    # batch: mean 5, sample std sqrt(25 + 25) = sqrt(50)
    b = 5 / (math.sqrt(50) + EPS)
    assert normalize_scores(s, "batch").tolist() == pytest.approx([-b, b], abs=1e-6)
    assert normalize_scores(torch.tensor([3.3, 3.3, 3.3]), "batch").tolist() == [0.0] * 3
    assert normalize_scores(s, "none", clip=3.0).tolist() == [0.0, 3.0]
    out = normalize_scores(s, "running", running=rm)
    # stats of [1..5, 0, 10]: sum 25, sum of squares 155; mean 25/7, sample var (155 - 625/7) / 6 = 230/21
    mu, sd = 25 / 7, math.sqrt(230 / 21)
    assert out.tolist() == pytest.approx([(0 - mu) / (sd + EPS), (10 - mu) / (sd + EPS)], abs=1e-5)
    g = normalize_scores(torch.tensor([1.0, 3.0, 10.0, 10.0, 7.0]), "group", groups=torch.tensor([0, 0, 1, 1, 2]))
    # group (1, 3): mean 2, sample std sqrt(2); (10, 10) all equal and (7) alone: 0 -- per-prompt offsets removed
    c = 1 / (math.sqrt(2) + EPS)
    assert g.tolist() == pytest.approx([-c, c, 0.0, 0.0, 0.0], abs=1e-6)
    with pytest.raises(ValueError, match="needs the group"):
        normalize_scores(s, "group")
    with pytest.raises(ValueError, match="unknown reward normalisation"):
        normalize_scores(s, "zscore")


def test_explained_variance():
    r = torch.tensor([1.0, 2.0, 3.0, 99.0])
    m = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert explained_variance(r, r, m) == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 2.0), r, m) == pytest.approx(0.0)
    assert math.isnan(explained_variance(r, torch.ones(4), m))
