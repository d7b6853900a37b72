"""rlweave.algo_parts.offpolicy: the ``algorithm.off_policy`` settings, the corrections
(``tis``, ``decoupled``: behaviour weights, truncation / dropping), metrics and their reduction,
against hand-computed values. Every correction in both modes: ``test_corrections.py``."""

import math
import subprocess
import sys

import pytest
import torch
from pydantic import ValidationError

from rlweave.algo_parts.corrections import decoupled, tis
from rlweave.algo_parts.offpolicy import OffPolicyConfig, correction_metrics, policy_correction, step_metrics
from rlweave.data.batch import Batch
from rlweave.interfaces.backend import merge_metric

# two samples, each a prompt token and two response tokens: [pA a1 a2 pB b1 b2]
# behaviour weights pi_prox / pi_behav of the response tokens: 0.2/0.4, 0.6/0.2, 0.3/0.2, 0.05/0.5
PROX = [0.0, 0.2, 0.6, 0.0, 0.3, 0.05]
BEHAV = [0.0, 0.4, 0.2, 0.0, 0.2, 0.5]
IW = [0.5, 3.0, 1.5, 0.1]
ACTIVE = torch.tensor([False, True, True, False, True, True])


def _logs(ps):
    return torch.tensor([math.log(p) if p > 0 else 0.0 for p in ps])


def _batch(**extra):
    b = Batch.from_sequences([[1, 2, 3], [4, 5, 6]], prompt_lens=[1, 1])
    b.add_token("token_weight", torch.tensor([0.0, 0.25, 0.25, 0.0, 0.25, 0.25]))
    b.add_token("rollout_logprobs", _logs(BEHAV))
    for k, v in extra.items():
        b.add_token(k, v)
    return b


def _on(t):
    return t[ACTIVE].tolist()


def log_weights(prox, behav, active, level, index=None, n=0):
    """The log weights ``tis`` and ``decoupled`` judge (their ``log_iw``)."""
    lr = torch.where(active, prox - behav, torch.zeros_like(prox))
    return tis(lr, active=active, sample_index=index, num_samples=n, level=level, cap=1e9).log_iw


def apply_correction(log_iw, cfg):
    """``tis`` / ``decoupled`` of ``cfg`` on token log weights ``log_iw`` (every token trained)."""
    fn = {"tis": tis, "decoupled": decoupled}[cfg.name]
    return fn(log_iw, active=torch.ones_like(log_iw, dtype=torch.bool), level="token", cap=cfg.cap, floor=cfg.floor)


# ------------------------------------------------------------------ settings
def test_defaults_are_no_correction():
    c = OffPolicyConfig()
    assert (c.name, c.mode, c.level, c.cap, c.floor, c.enabled) == ("none", "decoupled", "token", 2.0, None, False)
    assert OffPolicyConfig(correction="tis").enabled
    # the keys beside correction are the options of tis and decoupled
    assert OffPolicyConfig(correction="tis", level="sequence", cap=3.0, floor=0.5).part.options == {
        "level": "sequence", "cap": 3.0, "floor": 0.5}
    assert OffPolicyConfig(correction={"name": "tis", "cap": 3.0}).part.options == {
        "level": "token", "cap": 3.0, "floor": None}
    # switched off by an override, the section keeps its other keys
    assert not OffPolicyConfig(correction="none", level="sequence", cap=1.1, floor=0.5).enabled
    # a resolved config written out (every key at its value) reads back the same
    for c in (OffPolicyConfig(correction={"name": "icepop", "high": 4.0}, mode="bypass"),
              OffPolicyConfig(correction={"name": "tis", "cap": 3.0}), OffPolicyConfig(correction="tis", cap=3.0)):
        again = OffPolicyConfig.model_validate(c.model_dump())
        assert again == c and again.part == c.part


@pytest.mark.parametrize("fields,key,text", [
    ({"cap": 0.0}, "cap", "algorithm.off_policy.cap must be > 0"),
    ({"cap": -1.0}, "cap", "algorithm.off_policy.cap must be > 0"),
    ({"cap": 2.0, "floor": 2.0}, "floor", "algorithm.off_policy.floor (2.0) must be smaller than "
                                          "algorithm.off_policy.cap (2.0)"),
    ({"cap": 1.5, "floor": 3.0}, "floor", "must be smaller than algorithm.off_policy.cap"),
    ({"floor": 0.0}, "floor", "algorithm.off_policy.floor must be > 0 or null"),
    ({"correction": "is"}, "correction", "unknown rollout correction 'is'"),
    ({"level": "batch"}, "level", "'token' or 'sequence'"),
    ({"clip": 1.0}, "clip", "Extra inputs are not permitted"),
    ({"mode": "skip"}, "mode", "'decoupled' or 'bypass'"),
    ({"correction": "decoupled", "mode": "bypass"}, "mode", "which correction 'decoupled' needs"),
    ({"correction": "icepop", "cap": 3.0}, "cap", "algorithm.off_policy.cap is an option of corrections tis and "
                                                  "decoupled"),
    ({"correction": {"name": "tis", "cap": 3.0}, "floor": 0.5}, "floor", "given in the correction mapping"),
    ({"correction": {"name": "icepop", "low": 2.0, "high": 1.5}}, "correction",
     "rollout correction 'icepop': bad options: low (2) must be smaller than high (1.5)"),
    ({"correction": {"name": "token_mis", "high": 0.8}}, "correction", "low (1.25, 1 / high) must be smaller than"),
    ({"correction": {"name": "geo_mask", "hgh": 1.01}}, "correction", "hgh: Extra inputs are not permitted"),
    ({"correction": {"name": "seq_tis", "cap": 0}}, "correction", "cap: Input should be greater than 0"),
])
def test_invalid_settings_name_the_key(fields, key, text):
    with pytest.raises(ValidationError) as exc:
        OffPolicyConfig.model_validate(fields)
    (err,) = exc.value.errors()
    assert err["loc"] == (key,)
    assert text in str(exc.value)


def test_config_is_picklable_and_frozen():
    import pickle

    c = OffPolicyConfig(correction="decoupled", level="sequence", cap=3.0, floor=0.5)
    assert pickle.loads(pickle.dumps(c)) == c
    c2 = OffPolicyConfig(correction={"name": "icepop", "low": 0.4}, mode="bypass")
    assert pickle.loads(pickle.dumps(c2)) == c2
    with pytest.raises(ValidationError):
        c.cap = 4.0


def test_import_is_light():
    code = ("import sys; import rlweave.algo_parts.offpolicy; "
            "sys.exit(1 if any(m in sys.modules for m in ('torch', 'ray', 'vllm')) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ------------------------------------------------------------------ weights
def test_log_weights_per_token_and_per_sequence():
    prox, behav = _logs(PROX), _logs(BEHAV)
    tok = log_weights(prox, behav, ACTIVE, "token")
    assert torch.exp(tok)[ACTIVE].tolist() == pytest.approx(IW)
    assert tok[~ACTIVE].tolist() == [0.0, 0.0]  # prompts carry no weight
    b = _batch()
    seq = log_weights(prox, behav, ACTIVE, "sequence", b.sample_index(), len(b))
    # sequence A: 0.5 * 3.0 = 1.5 on both tokens; B: 1.5 * 0.1 = 0.15
    assert _on(torch.exp(seq)) == pytest.approx([1.5, 1.5, 0.15, 0.15])
    # a diverged token is bounded: exp(20) at most
    big = log_weights(torch.tensor([0.0]), torch.tensor([-100.0]), torch.tensor([True]), "token")
    assert big.item() == 20.0


def test_tis_truncates_at_cap():
    lw = torch.log(torch.tensor(IW))
    c = apply_correction(lw, OffPolicyConfig(correction="tis", cap=2.0))
    assert c.coef.tolist() == pytest.approx([0.5, 2.0, 1.5, 0.1])  # 3.0 truncated to the cap
    assert c.truncated.tolist() == [False, True, False, False]
    assert c.keep.all()


def test_decoupled_drops_above_cap_and_keeps_weight_unclipped():
    lw = torch.log(torch.tensor(IW))
    c = apply_correction(lw, OffPolicyConfig(correction="decoupled", cap=2.0))
    assert c.coef.tolist() == pytest.approx([0.5, 0.0, 1.5, 0.1])  # 3.0 > cap: dropped, not truncated
    assert c.keep.tolist() == [True, False, True, True]
    assert not c.truncated.any()


def test_floor_drops_below_it_for_both():
    lw = torch.log(torch.tensor(IW))
    tis = apply_correction(lw, OffPolicyConfig(correction="tis", cap=2.0, floor=0.2))
    assert tis.coef.tolist() == pytest.approx([0.5, 2.0, 1.5, 0.0])  # 0.1 < 0.2 dropped
    dec = apply_correction(lw, OffPolicyConfig(correction="decoupled", cap=2.0, floor=0.2))
    assert dec.coef.tolist() == pytest.approx([0.5, 0.0, 1.5, 0.0])
    assert dec.keep.tolist() == [True, False, True, False]


def test_metrics_hand_computed():
    prox, behav = _logs(PROX), _logs(BEHAV)
    w = torch.tensor([0.0, 0.25, 0.25, 0.0, 0.25, 0.25])
    cfg = OffPolicyConfig(correction="tis", cap=2.0, floor=0.2)
    corr = tis(torch.where(ACTIVE, prox - behav, torch.zeros(6)), active=ACTIVE, cap=2.0, floor=0.2)
    m = correction_metrics(corr, w, prox, behav)
    assert m["offpolicy/iw_mean"] == pytest.approx(0.25 * (0.5 + 3.0 + 1.5 + 0.1))
    assert m["offpolicy/iw_max"] == pytest.approx(3.0)
    assert m["offpolicy/iw_min"] == pytest.approx(0.1)
    assert m["offpolicy/truncated_frac"] == pytest.approx(0.25)  # 3.0 > 2
    assert m["offpolicy/masked_frac"] == pytest.approx(0.25)  # 0.1 < 0.2
    gap = 0.25 * (math.log(2) + math.log(3) + math.log(1.5) + math.log(10))
    assert m["offpolicy/logprob_gap"] == pytest.approx(gap)
    dec = decoupled(torch.where(ACTIVE, prox - behav, torch.zeros(6)), active=ACTIVE, cap=2.0)
    m2 = correction_metrics(dec, w, prox, behav)
    assert m2["offpolicy/truncated_frac"] == 0.0 and m2["offpolicy/masked_frac"] == pytest.approx(0.25)
    # no trained token: no max/min (a sum of nothing would read as 0)
    none = correction_metrics(corr, torch.zeros(6), prox, behav)
    assert "offpolicy/iw_max" not in none and none["offpolicy/iw_mean"] == 0.0


# ------------------------------------------------------------------ batch entry
def test_policy_correction_uses_old_logprobs_else_current_detached():
    b = _batch(old_logprobs=_logs(PROX))
    logp = torch.zeros(6, requires_grad=True)  # current policy: ignored while old_logprobs exist
    coef, m = policy_correction(OffPolicyConfig(correction="tis", level="sequence", cap=2.0), logp, b)
    assert _on(coef) == pytest.approx([1.5, 1.5, 0.15, 0.15]) and not coef.requires_grad
    assert m["offpolicy/iw_max"] == pytest.approx(1.5) and m["offpolicy/iw_min"] == pytest.approx(0.15)
    b2 = _batch()
    cur = _logs(PROX).requires_grad_(True)
    coef2, _ = policy_correction(OffPolicyConfig(correction="tis"), cur, b2)
    assert _on(coef2) == pytest.approx([0.5, 2.0, 1.5, 0.1]) and not coef2.requires_grad


def test_policy_correction_none_changes_nothing_and_errors_name_the_key():
    assert policy_correction(None, torch.zeros(6), _batch()) == (None, {})
    assert policy_correction(OffPolicyConfig(), torch.zeros(6), Batch.from_sequences([[1, 2]])) == (None, {})
    with pytest.raises(ValueError, match=r"algorithm\.off_policy\.correction is 'decoupled'.*'old_logprobs'"):
        policy_correction(OffPolicyConfig(correction="decoupled"), torch.zeros(6), _batch())
    b = _batch(old_logprobs=_logs(PROX))
    del b.token["rollout_logprobs"]
    with pytest.raises(ValueError, match=r"algorithm\.off_policy\.correction is 'tis'.*'rollout_logprobs'"):
        policy_correction(OffPolicyConfig(correction="tis"), torch.zeros(6), b)


# ------------------------------------------------------------------ reduction
def test_backend_reduction_of_loss_metrics():
    # three micro-batches' metrics, as a backend folds them: sums, except *_max / *_min
    parts = [{"pg_loss": 0.5, "offpolicy/iw_max": 1.2, "offpolicy/iw_min": 0.9},
             {"pg_loss": -0.25, "offpolicy/iw_max": 3.0, "offpolicy/iw_min": 0.7},
             {"pg_loss": 0.125, "offpolicy/iw_max": 0.8, "offpolicy/iw_min": 0.8}]
    total: dict = {}
    for p in parts:
        for k, v in p.items():
            total[k] = merge_metric(k, total.get(k), v)
    assert total == {"pg_loss": 0.375, "offpolicy/iw_max": 3.0, "offpolicy/iw_min": 0.7}


def test_step_metrics_mean_max_min_over_updates():
    rows = [{"offpolicy/iw_mean": 1.0, "offpolicy/iw_max": 2.0, "offpolicy/iw_min": 0.5, "loss": 3.0},
            {"offpolicy/iw_mean": 2.0, "offpolicy/iw_max": 4.0, "offpolicy/iw_min": 0.25,
             "offpolicy/masked_frac": 0.5}]
    assert step_metrics(rows) == {"offpolicy/iw_mean": 1.5, "offpolicy/iw_max": 4.0, "offpolicy/iw_min": 0.25,
                                  "offpolicy/masked_frac": 0.5}
    assert step_metrics([{"loss": 1.0}]) == {}
