"""Train/inference mismatch metrics (rlweave.algo_parts.mismatch) against hand-computed values,
their reduction over micro-batches and updates, and the warning naming the likely cause of a jump
(rlweave.algo_helpers.mismatch_monitor)."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from rlweave.algo_helpers.mismatch_monitor import MismatchMonitor, config_causes
from rlweave.algo_parts.mismatch import ACC, hist_quantile, mismatch_metrics, mismatch_sums
from rlweave.interfaces.backend import merge_metric

# three samples; per token: d = log pi_trainer - log pi_engine, trained?, staleness
#   S0: d 0.1, -0.2 (fresh)   S1: d 0.5 (one version old)   S2: d -1.0, 0.0 (two and three versions old)
# and an untrained token (d 7.0) in S2 that must count nowhere
D = [0.1, -0.2, 0.5, -1.0, 0.0, 7.0]
SAMPLE = [0, 0, 1, 2, 2, 2]
ACTIVE = [True, True, True, True, True, False]
AGE = [0, 0, 1, 2, 3, 0]
KEEP = [True, True, False, True, True, True]         # S1's token dropped by the correction
TRUNC = [True, False, False, False, False, False]    # S0's first token truncated
TRAINED = [d for d, a in zip(D, ACTIVE) if a]


def sums(idx=None, staleness=True):
    idx = list(range(len(D))) if idx is None else idx
    engine = torch.tensor([-1.0] * len(idx), dtype=torch.float64)
    trainer = engine + torch.tensor([D[i] for i in idx], dtype=torch.float64)
    samples = sorted({SAMPLE[i] for i in idx})
    index = torch.tensor([samples.index(SAMPLE[i]) for i in idx])
    t = lambda xs: torch.tensor([xs[i] for i in idx])  # noqa: E731
    return mismatch_sums(trainer, engine, t(ACTIVE), index, len(samples), t(AGE) if staleness else None,
                         t(KEEP), t(TRUNC))


def test_hand_values_over_the_trained_tokens():
    m = mismatch_metrics([sums()])
    n = 5
    assert m["mismatch/tokens"] == n
    assert m["mismatch/k1"] == pytest.approx(-sum(TRAINED) / n)                           # 0.12
    assert m["mismatch/k2"] == pytest.approx(sum(d * d / 2 for d in TRAINED) / n)         # 0.13
    assert m["mismatch/k3"] == pytest.approx(sum(math.exp(d) - 1 - d for d in TRAINED) / n)
    assert m["mismatch/chi2"] == pytest.approx(sum(math.exp(2 * d) for d in TRAINED) / n - 1)
    assert m["mismatch/dlogp_abs_mean"] == pytest.approx(0.36)
    assert m["mismatch/dlogp_abs_max"] == pytest.approx(1.0)
    assert m["mismatch/dlogp_abs_p50"] == pytest.approx(0.2, rel=0.12)   # |d| sorted: 0, 0.1, 0.2, 0.5, 1.0
    assert m["mismatch/dlogp_abs_p99"] == pytest.approx(1.0, rel=0.12) and m["mismatch/dlogp_abs_p99"] <= 1.0
    assert (m["mismatch/truncated_frac"], m["mismatch/masked_frac"]) == pytest.approx((0.2, 0.2))
    assert (m["mismatch/samples_truncated_frac"], m["mismatch/samples_masked_frac"]) == pytest.approx((1 / 3, 1 / 3))


def test_split_by_staleness():
    m = mismatch_metrics([sums()])
    assert m["mismatch/stale0/tokens_frac"] == pytest.approx(0.4)
    assert m["mismatch/stale0/k1"] == pytest.approx(0.05)                   # -(0.1 - 0.2) / 2
    assert m["mismatch/stale0/samples_truncated_frac"] == 1.0
    assert m["mismatch/stale1/tokens_frac"] == pytest.approx(0.2)
    assert m["mismatch/stale1/masked_frac"] == 1.0 and m["mismatch/stale1/samples_masked_frac"] == 1.0
    assert m["mismatch/stale1/dlogp_abs_max"] == pytest.approx(0.5)
    # three versions old counts as two or more; the sample's staleness is its oldest token's
    assert m["mismatch/stale2/tokens_frac"] == pytest.approx(0.4)
    assert m["mismatch/stale2/k2"] == pytest.approx(0.25)                   # (1 + 0) / 2 / 2
    assert m["mismatch/stale2/samples_masked_frac"] == 0.0
    # without staleness in the batch: no split
    assert not any("stale" in k for k in mismatch_metrics([sums(staleness=False)]))


def test_micro_batches_and_ranks_add_up_to_the_whole():
    """The backend folds micro-batches with merge_metric: two halves give the metrics of the whole."""
    total: dict = {}
    for part in (sums([0, 1, 2]), sums([3, 4, 5])):
        for k, v in part.items():
            total[k] = merge_metric(k, total.get(k), v)
    whole = mismatch_metrics([sums()])
    assert mismatch_metrics([total]) == pytest.approx(whole)


def test_rows_of_the_first_pass_sum_and_nothing_trained_gives_nothing():
    half = [sums([0, 1, 2]), sums([3, 4, 5])]
    assert mismatch_metrics(half) == pytest.approx(mismatch_metrics([sums()]))
    assert mismatch_metrics([]) == {} and mismatch_metrics([{"loss": 1.0}]) == {}
    nothing = mismatch_sums(torch.zeros(3), torch.zeros(3), torch.zeros(3, dtype=torch.bool), torch.zeros(3).long(), 1)
    assert nothing == {} and mismatch_sums(torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.bool),
                                           torch.zeros(0).long(), 0) == {}


def test_equal_logprobs_measure_zero_and_extremes_stay_finite():
    e = torch.tensor([-1.0, -2.0, -3.0])
    m = mismatch_metrics([mismatch_sums(e.clone(), e, torch.ones(3, dtype=torch.bool), torch.tensor([0, 0, 1]), 2)])
    assert all(m[f"mismatch/{k}"] == 0.0 for k in ("k1", "k2", "k3", "chi2", "dlogp_abs_p50", "dlogp_abs_p99",
                                                    "dlogp_abs_max"))
    far = mismatch_sums(torch.tensor([0.0, -200.0]), torch.tensor([-200.0, 0.0]), torch.ones(2, dtype=torch.bool),
                        torch.tensor([0, 1]), 2)
    assert all(math.isfinite(v) for v in mismatch_metrics([far]).values())


def test_histogram_quantiles():
    # 100 values 10^(-4 + 4 i / 100): the exact quantiles, within one bin (12%)
    vals = [10 ** (-4 + 4 * i / 100) for i in range(100)]
    x = torch.tensor(vals, dtype=torch.float64)
    s = mismatch_sums(x, torch.zeros(100, dtype=torch.float64), torch.ones(100, dtype=torch.bool),
                      torch.zeros(100).long(), 1)
    hist = {int(k.rsplit("/", 1)[1]): v for k, v in s.items() if k.startswith(f"{ACC}hist/")}
    for q, exact in ((0.5, vals[49]), (0.99, vals[98]), (0.1, vals[9])):
        assert hist_quantile(hist, q, max(vals)) == pytest.approx(exact, rel=0.13)
    assert hist_quantile({}, 0.5, 1.0) == 0.0


# ------------------------------------------------------------------ the warning
def run_config(engine="auto", policy="float32", mixed=None, logprobs_mode=None):
    options = {"dtype": engine} | ({"logprobs_mode": logprobs_mode} if logprobs_mode else {})
    return {"model": {"dtype": policy}, "roles": {"rollout": {"options": options},
                                                  "policy": {"options": {"mixed_precision": mixed} if mixed else {}}}}


def test_causes_a_config_makes_likely():
    algo = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
    assert config_causes(run_config(), algo) == {}
    assert "bfloat16" in config_causes(run_config(engine="bfloat16"), algo)["dtype"]
    assert "dtype" in config_causes(run_config(policy="float32", mixed="bf16", engine="auto"), algo)
    assert "dtype" not in config_causes(run_config(engine="bfloat16", mixed="bf16"), algo)
    assert "top_p 0.9" in config_causes(run_config(), {**algo, "top_p": 0.9})["sampling"]
    assert "top_k 20" in config_causes(run_config(), {**algo, "top_k": 20})["sampling"]
    assert "raw" in config_causes(run_config(logprobs_mode="raw"), {**algo, "temperature": 0.7})["sampling"]
    assert config_causes(run_config(logprobs_mode="raw"), algo) == {}


def test_causes_from_a_real_run_config():
    from pathlib import Path

    from rlweave.config.loader import load_config

    example = Path(__file__).resolve().parents[2] / "examples/arith/grpo.yaml"
    cfg, resolved = load_config(example, ["roles.rollout.options.dtype=bfloat16", "algorithm.top_p=0.95"],
                                check_inputs=False)
    assert set(config_causes(cfg, resolved.algorithm_config)) == {"dtype", "sampling"}
    _, resolved = load_config(example, ["algorithm.off_policy.correction={name: geo_mask, high: 1.01}"],
                              check_inputs=False)
    assert MismatchMonitor.for_run(cfg, resolved.algorithm_config).correction == "geo_mask"


def test_a_jump_is_warned_once_per_cause(caplog):
    mon = MismatchMonitor.for_run(run_config(engine="bfloat16"), {"top_p": 0.9})
    caplog.set_level(logging.WARNING, logger="rlweave.algo")
    assert mon.observe({"mismatch/k3": 2e-4}, 1) == []          # below the floor
    assert mon.observe({"mismatch/k3": 3e-4}, 2) == []
    msgs = mon.observe({"mismatch/k3": 0.02, "mismatch/dlogp_abs_p99": 0.9}, 3)
    assert len(msgs) == 2 and "step 3" in msgs[0] and "mismatch/k3 0.02" in msgs[0]
    assert "bfloat16" in msgs[0] and "top_p 0.9" in msgs[1]
    assert [r.getMessage() for r in caplog.records if r.name == "rlweave.algo"] == msgs
    # another jump with the same causes: already said
    mon.baseline = 1e-4
    assert mon.observe({"mismatch/k3": 0.05}, 4) == []
    # stale tokens carrying the gap: a new cause
    stale = {"mismatch/k3": 0.5, "mismatch/stale0/k3": 1e-4, "mismatch/stale1/k3": 0.8}
    mon.baseline = 1e-4
    (msg,) = mon.observe(stale, 5)
    assert "stale weights: tokens one version old" in msg


def test_no_jump_without_a_rise_and_an_unknown_cause_is_said():
    mon = MismatchMonitor.for_run(run_config(), {})
    assert mon.observe({"mismatch/k3": 0.01}, 1)[0].endswith(
        "none of stale weights, different dtypes or truncated sampling; check that weight syncs land "
        "(sync_bytes), the engine's kernels and the models' numerics")
    assert mon.observe({"mismatch/k3": 0.012}, 2) == []         # steady: no jump
    assert mon.observe({}, 3) == []                             # no metrics: nothing to say


def test_a_correction_dropping_most_samples_is_warned_once_with_its_key(caplog):
    from rlweave.algo_parts.offpolicy import OffPolicyConfig

    algo = {"off_policy": OffPolicyConfig(correction="geo_mask")}
    mon = MismatchMonitor.for_run(run_config(), algo)
    caplog.set_level(logging.WARNING, logger="rlweave.algo")
    assert mon.observe({"mismatch/k3": 1e-4, "mismatch/samples_masked_frac": 0.3}, 1) == []
    (msg,) = mon.observe({"mismatch/k3": 1e-4, "mismatch/samples_masked_frac": 0.73,
                          "mismatch/dlogp_abs_mean": 6e-3}, 2)
    assert "geo_mask dropped 73% of the samples at step 2" in msg and "{name: geo_mask, low: ..., high: ...}" in msg
    assert mon.observe({"mismatch/k3": 1e-4, "mismatch/samples_masked_frac": 0.9}, 3) == []  # once per run
    # a jump in the same step as the drop: both said
    both = MismatchMonitor.for_run(run_config(engine="bfloat16"), algo)
    msgs = both.observe({"mismatch/k3": 0.02, "mismatch/samples_masked_frac": 0.6}, 1)
    assert len(msgs) == 2 and "dropped 60%" in msgs[0] and "bfloat16" in msgs[1]
