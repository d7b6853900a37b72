"""Every rollout correction (rlweave.algo_parts.corrections) in both modes of
``algorithm.off_policy``, in float64 against hand-computed values, on a ragged micro-batch with
a sample without trained tokens and a sample every band drops whole; gradient checks; ``bypass``
equal to ``decoupled`` bit for bit when the engine's log-probs equal the old ones.

The micro-batch: four samples, a prompt token each, then (proximal / behaviour probabilities)

* A: three trained tokens, rho = 0.6, 3.0, 1.5 (product 2.7, geometric mean 2.7^(1/3) = 1.392)
* B: one trained token, rho = 1.2
* C: two tokens with token weight 0 (no trained token; extreme log-probs that must not leak)
* D: two trained tokens, rho = 8, 10 (product 80): outside every band below, dropped whole
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlweave.algo_parts.objective import PolicyObjective
from rlweave.algo_parts.offpolicy import OffPolicyConfig, apply_correction, policy_correction
from rlweave.algo_parts.spec import resolve
from rlweave.data.batch import Batch

SEQS = [[1, 2, 3, 4], [5, 6], [7, 8, 9], [10, 11, 12]]
# per token: (proximal prob, behaviour prob), None on prompt tokens
PAIRS = [None, (0.3, 0.5), (0.6, 0.2), (0.45, 0.3),
         None, (0.6, 0.5),
         None, (1e-30, 0.9), (0.9, 1e-30),
         None, (0.8, 0.1), (0.5, 0.05)]
WEIGHT = [0.0, 0.2, 0.2, 0.2, 0.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.1, 0.1]
ADV = [0.0, 1.0, -0.5, 2.0, 0.0, -1.0, 0.0, 3.0, -3.0, 0.0, 0.5, 1.5]
ACTIVE = [w > 0 for w in WEIGHT]
RHO = {1: 0.6, 2: 3.0, 3: 1.5, 5: 1.2, 10: 8.0, 11: 10.0}  # trained token -> pi_prox / pi_behav

# (correction as written in YAML, expected c_t on the trained tokens in RHO's order, dropped tokens)
CASES = [
    ("token_tis", [0.6, 2.0, 1.5, 1.2, 2.0, 2.0], set()),
    ({"name": "token_tis", "cap": 1.0}, [0.6, 1.0, 1.0, 1.0, 1.0, 1.0], set()),
    ("seq_tis", [2.0, 2.0, 2.0, 1.2, 2.0, 2.0], set()),
    ({"name": "seq_tis", "cap": 3.0}, [2.7, 2.7, 2.7, 1.2, 3.0, 3.0], set()),
    ("token_mis", [0.6, 0.0, 1.5, 1.2, 0.0, 0.0], {2, 10, 11}),           # band [0.5, 2]
    ({"name": "token_mis", "low": 0.7, "high": 4.0}, [0.0, 3.0, 1.5, 1.2, 0.0, 0.0], {1, 10, 11}),
    ({"name": "seq_mis", "high": 3.0}, [2.7, 2.7, 2.7, 1.2, 0.0, 0.0], {10, 11}),  # band [1/3, 3]
    ("seq_mis", [0.0, 0.0, 0.0, 1.2, 0.0, 0.0], {1, 2, 3, 10, 11}),        # band [0.5, 2]: A's 2.7 out
    ("icepop", [0.6, 3.0, 1.5, 1.2, 0.0, 0.0], {10, 11}),                  # band [0.5, 5]
    ({"name": "geo_mask", "high": 1.5}, [0.6, 3.0, 1.5, 1.2, 0.0, 0.0], {10, 11}),
    ({"name": "geo_mask", "high": 1.5, "token_weights": False}, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0], {10, 11}),
    ({"name": "geo_mask", "high": 1.3}, [0.0, 0.0, 0.0, 1.2, 0.0, 0.0], {1, 2, 3, 10, 11}),  # A's 1.392 out
    ("tis", [0.6, 2.0, 1.5, 1.2, 2.0, 2.0], set()),
    ({"name": "tis", "level": "sequence", "floor": 0.5}, [2.0, 2.0, 2.0, 1.2, 2.0, 2.0], set()),
    ({"name": "tis", "cap": 3.0, "floor": 0.7}, [0.0, 3.0, 1.5, 1.2, 3.0, 3.0], {1}),
    ("decoupled", [0.6, 0.0, 1.5, 1.2, 0.0, 0.0], {2, 10, 11}),
]
IDS = [c if isinstance(c, str) else "-".join(f"{v}" for v in c.values()) for c, *_ in CASES]


def _log(p):
    return math.log(p)


def batch(engine_is_old: bool = False) -> Batch:
    b = Batch.from_sequences(SEQS, prompt_lens=[1, 1, 1, 1])
    prox = torch.tensor([_log(p[0]) if p else 0.0 for p in PAIRS], dtype=torch.float64)
    behav = prox.clone() if engine_is_old else torch.tensor([_log(p[1]) if p else 0.0 for p in PAIRS],
                                                           dtype=torch.float64)
    b.add_token("old_logprobs", prox)
    b.add_token("rollout_logprobs", behav)
    b.add_token("token_weight", torch.tensor(WEIGHT, dtype=torch.float64))
    b.add_token("advantages", torch.tensor(ADV, dtype=torch.float64))
    return b


def config(correction, mode="decoupled") -> OffPolicyConfig:
    return OffPolicyConfig(correction=correction, mode=mode)


def objective(correction, mode="decoupled", clip=0.2) -> PolicyObjective:
    loss = resolve("policy_loss", {"name": "ppo_clip", "clip_low": clip, "clip_high": clip})
    return PolicyObjective(policy_loss=loss, off_policy=config(correction, mode))


def _trained(t):
    return [t[i].item() for i in RHO]


# ------------------------------------------------------------ hand values, both modes
@pytest.mark.parametrize("correction, expected, dropped", CASES, ids=IDS)
def test_decoupled_hand_values(correction, expected, dropped):
    b = batch()
    logp = b.token["old_logprobs"].clone().requires_grad_(True)
    cfg = config(correction)
    applied = apply_correction(cfg, cfg.part, logp, b)
    assert _trained(applied.coef) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert {i for i in RHO if not applied.correction.keep[i]} == dropped
    assert all(applied.correction.keep[i] for i in range(len(PAIRS)) if not ACTIVE[i])  # only trained tokens drop
    assert torch.isfinite(applied.coef).all() and not applied.coef.requires_grad
    assert all(math.isfinite(v) for v in applied.metrics.values())


@pytest.mark.parametrize("correction, expected, dropped", CASES, ids=IDS)
def test_bypass_hand_values_replace_the_loss_ratio(correction, expected, dropped):
    """bypass: the loss's ratio r = pi_theta / pi_behav carries rho already (pi_theta = pi_prox at the
    first update), so the factor is c_t / r_t; c_t is judged on sg(pi_theta) / pi_behav."""
    if isinstance(correction, str) and correction == "decoupled":
        pytest.skip("decoupled needs the proximal policy: refused in bypass (test_offpolicy)")
    b = batch()
    del b.token["old_logprobs"]  # bypass never reads it: the pass is skipped
    logp = torch.tensor([_log(p[0]) if p else 0.0 for p in PAIRS], dtype=torch.float64, requires_grad=True)
    cfg = config(correction, "bypass")
    ratio = torch.exp((logp - b.token["rollout_logprobs"]).clamp(-20, 20)).detach()
    applied = apply_correction(cfg, cfg.part, logp, b, ratio)
    want = [c / RHO[i] for c, i in zip(expected, RHO)]
    assert _trained(applied.coef) == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert {i for i in RHO if not applied.correction.keep[i]} == dropped
    assert torch.isfinite(applied.coef).all()


@pytest.mark.parametrize("correction, expected, dropped", CASES, ids=IDS)
def test_loss_and_gradient_at_the_first_update(correction, expected, dropped):
    """loss = sum_t w_t c_t pg_t; with the old policy equal to the current one (first update) and a clip
    too wide to bind, pg_t = -A_t r_t and d loss / d logp_t = -w_t A_t c_t, in both modes."""
    modes = ("decoupled",) if correction == "decoupled" else ("decoupled", "bypass")
    for mode in modes:
        b = batch()
        if mode == "bypass":
            del b.token["old_logprobs"]
        logp = torch.tensor([_log(p[0]) if p else 0.0 for p in PAIRS], dtype=torch.float64, requires_grad=True)
        loss, m = objective(correction, mode, clip=100.0)(SimpleNamespace(logprobs=logp, entropy=None), b)
        loss.backward()
        c = dict(zip(RHO, expected))
        want_grad = [-WEIGHT[i] * ADV[i] * c[i] if i in c else 0.0 for i in range(len(PAIRS))]
        assert logp.grad.tolist() == pytest.approx(want_grad, rel=1e-12, abs=1e-15), mode
        assert loss.item() == pytest.approx(sum(want_grad), rel=1e-12, abs=1e-15), mode
        assert all(math.isfinite(v) for v in m.values()), mode


def test_none_leaves_the_loss_alone_in_decoupled_mode():
    b = batch()
    logp = b.token["old_logprobs"].clone().requires_grad_(True)
    assert policy_correction(config("none"), logp, b) == (None, {})
    plain = resolve("policy_loss", "ppo_clip")
    a = PolicyObjective(policy_loss=plain)(SimpleNamespace(logprobs=logp, entropy=None), b)[0]
    n = objective("none")(SimpleNamespace(logprobs=logp, entropy=None), b)[0]
    assert torch.equal(a, n)


# ------------------------------------------------------------ gradient checks
@pytest.mark.parametrize("correction", [c for c, *_ in CASES] + ["none"], ids=IDS + ["none"])
def test_gradcheck_decoupled(correction):
    """The corrected loss is a smooth function of the policy's log-probs (the weights are judged on
    the recomputed proximal policy): autograd's gradient equals finite differences."""
    b = batch()
    base = b.token["old_logprobs"] + torch.tensor([0.0, 0.05, -0.1, 0.02, 0, 0.07, 0, 0, 0, 0, -0.03, 0.04],
                                                  dtype=torch.float64)
    fn = objective(correction)

    def loss(lp):
        return fn(SimpleNamespace(logprobs=lp, entropy=None), b)[0]

    assert torch.autograd.gradcheck(loss, (base.clone().requires_grad_(True),), eps=1e-6, atol=1e-8, fast_mode=True)


# ------------------------------------------------------------ bypass == decoupled
@pytest.mark.parametrize("correction", [c for c, *_ in CASES if c != "decoupled"] + ["none"],
                         ids=[i for (c, *_), i in zip(CASES, IDS) if c != "decoupled"] + ["none"])
def test_bypass_equals_decoupled_bitwise_when_the_engine_has_the_old_logprobs(correction):
    outs = []
    for mode in ("decoupled", "bypass"):
        b = batch(engine_is_old=True)
        logp = b.token["old_logprobs"].clone().requires_grad_(True)
        loss, m = objective(correction, mode)(SimpleNamespace(logprobs=logp, entropy=None), b)
        loss.backward()
        outs.append((loss.detach(), logp.grad, m))
    (l1, g1, m1), (l2, g2, m2) = outs
    assert torch.equal(l1, l2) and torch.equal(g1, g2)
    assert {k: v for k, v in m1.items() if k != "ppo_kl"} == {k: v for k, v in m2.items() if k != "ppo_kl"}


def test_bypass_with_no_correction_is_plain_ppo_against_the_engine():
    """mode bypass, correction none: the ratio and its clip are taken against the engine's log-probs,
    whatever the current policy (no factor at all)."""
    b = batch()
    logp = (b.token["old_logprobs"] + 0.1).requires_grad_(True)
    got = objective("none", "bypass")(SimpleNamespace(logprobs=logp, entropy=None), b)[0]
    b2 = batch()
    b2.token["old_logprobs"] = b2.token["rollout_logprobs"].clone()
    want = PolicyObjective(policy_loss=resolve("policy_loss", "ppo_clip"))(
        SimpleNamespace(logprobs=logp, entropy=None), b2)[0]
    assert torch.equal(got, want)


def test_bypass_needs_the_engine_logprobs():
    b = batch()
    del b.token["rollout_logprobs"]
    logp = b.token["old_logprobs"].clone().requires_grad_(True)
    with pytest.raises(ValueError, match=r"algorithm\.off_policy\.mode is 'bypass'.*'rollout_logprobs'"):
        objective("none", "bypass")(SimpleNamespace(logprobs=logp, entropy=None), b)


# ------------------------------------------------------------ empty and all-masked micro-batches
@pytest.mark.parametrize("mode", ["decoupled", "bypass"])
@pytest.mark.parametrize("correction", [c for c, *_ in CASES if c != "decoupled"], ids=IDS[:-1])
def test_nothing_trained_or_everything_dropped_gives_no_nan(correction, mode):
    for weights in ([0.0] * len(PAIRS), [0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.5, 0.5]):  # none; only D (dropped by bands)
        b = batch()
        b.token["token_weight"] = torch.tensor(weights, dtype=torch.float64)
        logp = b.token["old_logprobs"].clone().requires_grad_(True)
        loss, m = objective(correction, mode)(SimpleNamespace(logprobs=logp, entropy=None), b)
        loss.backward()
        assert math.isfinite(loss.item()) and torch.isfinite(logp.grad).all()
        assert all(math.isfinite(v) for v in m.values()), m
