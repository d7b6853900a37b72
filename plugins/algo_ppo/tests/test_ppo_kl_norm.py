"""KL controllers, advantage whitening, reward normalisation, explained variance."""

import math

import pytest
import torch

from rlweave_algo_ppo.kl_controller import AdaptiveKLController, FixedKLController, make_kl_controller
from rlweave_algo_ppo.normalize import (
    RunningMoments,
    explained_variance,
    masked_whiten,
    normalize_scores,
)


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


def test_masked_whiten_global_stats():
    x = torch.tensor([1.0, 2.0, 3.0, 50.0])
    m = torch.tensor([1.0, 1.0, 1.0, 0.0])
    y = masked_whiten(x, m)
    s = math.sqrt(2 / 3)
    assert y.tolist() == pytest.approx([-1 / s, 0.0, 1 / s, 0.0], abs=1e-6)
    # whitening the whole batch is not whitening its halves: statistics are global
    halves = torch.cat([masked_whiten(x[:2], m[:2]), masked_whiten(x[2:], m[2:])])
    assert not torch.allclose(halves, y)
    y2 = masked_whiten(x, m, shift_mean=False)
    assert y2.tolist() == pytest.approx([-1 / s + 2, 2.0, 1 / s + 2, 0.0], abs=1e-6)


def test_running_moments_and_score_normalisation():
    rm = RunningMoments()
    rm.update(torch.tensor([1.0, 2.0]))
    rm.update(torch.tensor([3.0, 4.0, 5.0]))
    assert rm.mean == pytest.approx(3.0) and rm.std == pytest.approx(math.sqrt(2.0))
    s = torch.tensor([0.0, 10.0])
    assert normalize_scores(s, "batch").tolist() == pytest.approx([-1.0, 1.0], abs=1e-6)
    assert normalize_scores(s, "none", clip=3.0).tolist() == [0.0, 3.0]
    out = normalize_scores(s, "running", running=rm)  # stats of [1..5, 0, 10]
    allv = torch.tensor([1.0, 2, 3, 4, 5, 0, 10], dtype=torch.float64)
    mu, sd = allv.mean().item(), allv.std(unbiased=False).item()
    assert out.tolist() == pytest.approx([(0 - mu) / sd, (10 - mu) / sd], abs=1e-5)
    g = normalize_scores(torch.tensor([1.0, 3.0, 10.0, 10.0, 7.0]), "group", groups=torch.tensor([0, 0, 1, 1, 2]))
    assert g.tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0, 0.0], abs=1e-6)  # per-prompt offsets removed
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
