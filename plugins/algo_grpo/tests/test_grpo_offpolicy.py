"""GRPO's loss (PolicyObjective with ppo_clip) with ``algorithm.off_policy`` against
hand-computed losses and gradients: none (bit-identical to the uncorrected loss), truncated
importance sampling and decoupled PPO per token and per sequence, the floor, errors, and the
config keys."""

import math
import pickle
from dataclasses import dataclass

import pytest
import torch

from rlweave.algo_parts.offpolicy import OffPolicyConfig
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


# Tokens [pA a1 a2 pB b1 b2]: two samples of a prompt token and two response tokens, token mean
# (w = 1/4 on each response token). Advantages: sample A +1, sample B -1.
# Proximal probabilities (old_logprobs) 0.2 0.6 | 0.3 0.05, behaviour (rollout_logprobs) 0.4 0.2 | 0.2 0.5:
# behaviour weights iw = 0.5, 3.0 | 1.5, 0.1; per sequence A: 0.5*3 = 1.5, B: 1.5*0.1 = 0.15.
# Current policy / proximal ratios r = 1.0, 1.3 | 0.9, 1.0 (clip 0.2).
# Per-token surrogate pg = -min(r*A, clip(r)*A):
#   a1 = -1.0; a2 = -min(1.3, 1.2) = -1.2 (clipped: no gradient); b1 = 0.9; b2 = 1.0
# Gradient of w*c*pg w.r.t. logp on unclipped tokens: -w*c*A*r = a1 -0.25c, b1 +0.225c, b2 +0.25c.
PROX = [0.2, 0.6, 0.3, 0.05]
BEHAV = [0.4, 0.2, 0.2, 0.5]
RATIO = [1.0, 1.3, 0.9, 1.0]
RESP = [1, 2, 4, 5]  # response token positions


def _full(vals, fill=0.0):
    out = torch.full((6,), fill)
    out[RESP] = torch.tensor(vals)
    return out


def _batch(old=True):
    b = Batch.from_sequences([[1, 2, 3], [4, 5, 6]], prompt_lens=[1, 1])
    b.add_token("token_weight", _full([0.25] * 4))
    b.add_token("advantages", _full([1.0, 1.0, -1.0, -1.0]))
    b.add_token("rollout_logprobs", _full([math.log(p) for p in BEHAV]))
    if old:
        b.add_token("old_logprobs", _full([math.log(p) for p in PROX]))
    return b


def _logp(ratio=RATIO):
    return _full([math.log(p * r) for p, r in zip(PROX, ratio)]).requires_grad_(True)


def _run(off_policy, batch=None, logp=None):
    lp = _logp() if logp is None else logp
    b = _batch() if batch is None else batch
    loss, m = objective(clip_low=0.2, clip_high=0.2, off_policy=off_policy)(Out(lp), b)
    loss.backward()
    return loss.item(), lp.grad[RESP].tolist(), m


def test_none_is_bit_identical_to_the_uncorrected_loss():
    b = _batch()
    lp_ref = _logp()
    # the uncorrected loss, written out: sum_t w_t * -min(r A, clip(r) A)
    ratio = torch.exp((lp_ref - b.token["old_logprobs"]).clamp(-20.0, 20.0))
    adv = b.token["advantages"]
    ref = (b.token["token_weight"] * -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)).sum()
    ref.backward()
    for off in (None, OffPolicyConfig(), OffPolicyConfig(correction="none", level="sequence", cap=1.1, floor=0.5)):
        lp = _logp()
        loss, m = objective(off_policy=off)(Out(lp), b)
        loss.backward()
        assert torch.equal(loss, ref) and torch.equal(lp.grad, lp_ref.grad)
        assert not any(k.startswith("offpolicy/") for k in m)
    loss, _, _ = _run(None)
    assert loss == pytest.approx(0.25 * (-1.0 - 1.2 + 0.9 + 1.0))  # -0.075


def test_tis_token():
    loss, grad, m = _run(OffPolicyConfig(correction="tis", level="token", cap=2.0))
    # c = 0.5, min(3.0, 2) = 2.0, 1.5, 0.1
    assert loss == pytest.approx(0.25 * (-1.0 * 0.5 - 1.2 * 2.0 + 0.9 * 1.5 + 1.0 * 0.1))  # -0.3625
    assert grad == pytest.approx([-0.25 * 0.5, 0.0, 0.225 * 1.5, 0.25 * 0.1])
    assert m["pg_loss"] == pytest.approx(loss)
    assert m["offpolicy/iw_mean"] == pytest.approx(0.25 * (0.5 + 3.0 + 1.5 + 0.1))
    assert m["offpolicy/iw_max"] == pytest.approx(3.0) and m["offpolicy/iw_min"] == pytest.approx(0.1)
    assert m["offpolicy/truncated_frac"] == pytest.approx(0.25) and m["offpolicy/masked_frac"] == 0.0
    assert m["offpolicy/logprob_gap"] == pytest.approx(0.25 * sum(abs(math.log(p / q)) for p, q in zip(PROX, BEHAV)))
    assert m["clip_frac"] == pytest.approx(0.25)  # the ratio clip is still taken against the proximal policy


def test_tis_sequence():
    loss, grad, m = _run(OffPolicyConfig(correction="tis", level="sequence", cap=2.0))
    # c = 1.5 on A's tokens, 0.15 on B's (neither above the cap)
    assert loss == pytest.approx(0.25 * (1.5 * (-1.0 - 1.2) + 0.15 * (0.9 + 1.0)))  # -0.75375
    assert grad == pytest.approx([-0.25 * 1.5, 0.0, 0.225 * 0.15, 0.25 * 0.15])
    assert m["offpolicy/iw_mean"] == pytest.approx(0.25 * (1.5 + 1.5 + 0.15 + 0.15))
    assert (m["offpolicy/iw_max"], m["offpolicy/iw_min"]) == pytest.approx((1.5, 0.15))
    assert m["offpolicy/truncated_frac"] == 0.0
    # with cap 1.2, sequence A (1.5) is truncated as a whole
    loss2, grad2, m2 = _run(OffPolicyConfig(correction="tis", level="sequence", cap=1.2))
    assert loss2 == pytest.approx(0.25 * (1.2 * (-2.2) + 0.15 * 1.9))
    assert grad2 == pytest.approx([-0.25 * 1.2, 0.0, 0.225 * 0.15, 0.25 * 0.15])
    assert m2["offpolicy/truncated_frac"] == pytest.approx(0.5)


def test_decoupled_token():
    loss, grad, m = _run(OffPolicyConfig(correction="decoupled", level="token", cap=2.0))
    # c = 0.5, dropped (3.0 > 2), 1.5, 0.1: weights applied unclipped, the dropped token adds nothing
    assert loss == pytest.approx(0.25 * (-1.0 * 0.5 + 0.9 * 1.5 + 1.0 * 0.1))  # 0.2375
    assert grad == pytest.approx([-0.125, 0.0, 0.3375, 0.025])
    assert m["offpolicy/masked_frac"] == pytest.approx(0.25) and m["offpolicy/truncated_frac"] == 0.0


def test_decoupled_sequence():
    loss, grad, m = _run(OffPolicyConfig(correction="decoupled", level="sequence", cap=1.2))
    # A's weight 1.5 > 1.2: both its tokens dropped; B's 0.15 applied to both of its tokens
    assert loss == pytest.approx(0.25 * 0.15 * (0.9 + 1.0))  # 0.07125
    assert grad == pytest.approx([0.0, 0.0, 0.225 * 0.15, 0.25 * 0.15])
    assert m["offpolicy/masked_frac"] == pytest.approx(0.5)
    # the normalisation stays the algorithm's: the kept tokens still weigh 1/4 each, not 1/2
    assert loss == pytest.approx(0.07125)


def test_floor():
    loss, grad, m = _run(OffPolicyConfig(correction="tis", level="token", cap=2.0, floor=0.2))
    # b2's weight 0.1 < 0.2: dropped; the rest as in tis token
    assert loss == pytest.approx(0.25 * (-0.5 - 1.2 * 2.0 + 0.9 * 1.5))  # -0.3875
    assert grad == pytest.approx([-0.125, 0.0, 0.3375, 0.0])
    assert m["offpolicy/masked_frac"] == pytest.approx(0.25) and m["offpolicy/truncated_frac"] == pytest.approx(0.25)
    loss2, grad2, m2 = _run(OffPolicyConfig(correction="decoupled", level="sequence", cap=2.0, floor=0.2))
    # A (1.5) kept, B (0.15 < 0.2) dropped
    assert loss2 == pytest.approx(0.25 * 1.5 * (-1.0 - 1.2))  # -0.825
    assert grad2 == pytest.approx([-0.375, 0.0, 0.0, 0.0])
    assert m2["offpolicy/masked_frac"] == pytest.approx(0.5)


def test_tis_without_old_logprobs_uses_the_current_policy_detached():
    b = _batch(old=False)
    lp = _full([math.log(p) for p in PROX]).requires_grad_(True)
    loss, grad, m = _run(OffPolicyConfig(correction="tis", cap=2.0), b, lp)
    # ratio 1: pg = -A; c = 0.5, 2.0, 1.5, 0.1
    assert loss == pytest.approx(0.25 * (-0.5 - 2.0 + 1.5 + 0.1))  # -0.225
    assert grad == pytest.approx([-0.125, -0.5, 0.375, 0.025])
    assert m["offpolicy/iw_max"] == pytest.approx(3.0)


def test_kl_term_is_not_corrected():
    b = _batch()
    b.add_token("ref_logprobs", _full([math.log(p) for p in PROX]))
    off = OffPolicyConfig(correction="decoupled", level="sequence", cap=1.2)
    loss, m = objective(kl_beta=0.1, off_policy=off)(Out(_logp().detach()), b)
    # k3 with r = ref - logp = -log(ratio): 1/ratio + log(ratio) - 1, on every response token
    kl = 0.25 * sum(1 / x + math.log(x) - 1 for x in RATIO)
    assert m["kl"] == pytest.approx(kl, rel=1e-5)  # float32 arithmetic
    assert loss.item() == pytest.approx(0.07125 + 0.1 * kl, rel=1e-5)


def test_errors_name_the_key_and_field():
    with pytest.raises(ValueError, match=r"algorithm\.off_policy\.correction is 'decoupled'.*'old_logprobs'"):
        _run(OffPolicyConfig(correction="decoupled"), _batch(old=False))
    b = _batch()
    del b.token["rollout_logprobs"]
    with pytest.raises(ValueError, match="'rollout_logprobs'"):
        _run(OffPolicyConfig(correction="tis"), b)


def test_loss_with_off_policy_is_picklable():
    off = OffPolicyConfig(correction="tis", level="sequence", cap=3.0, floor=0.1)
    fn = pickle.loads(pickle.dumps(objective(clip_high=0.28, off_policy=off)))
    assert fn.off_policy == off and fn.policy_loss.options["clip_high"] == 0.28


def test_config_section_and_errors_with_their_dotted_path():
    from pathlib import Path

    from rlweave.config.errors import ConfigError
    from rlweave.config.loader import load_config
    from rlweave_algo_grpo.config import GRPOConfig

    assert GRPOConfig().off_policy == OffPolicyConfig()
    cfg = GRPOConfig.model_validate({"off_policy": {"correction": "decoupled", "level": "sequence", "cap": 3}})
    assert (cfg.off_policy.name, cfg.off_policy.level, cfg.off_policy.cap) == ("decoupled", "sequence", 3.0)
    example = Path(__file__).resolve().parents[3] / "examples/arith/grpo.yaml"
    _, resolved = load_config(example, ["algorithm.off_policy.correction=tis", "algorithm.off_policy.floor=0.5"],
                              check_inputs=False)
    assert resolved.algorithm_config.off_policy.name == "tis"
    with pytest.raises(ConfigError) as exc:
        load_config(example, ["algorithm.off_policy.cap=0", "algorithm.off_policy.level=batch",
                              "algorithm.off_policy.capp=1"], check_inputs=False)
    paths = {i.path for i in exc.value.issues}
    assert {"algorithm.off_policy.cap", "algorithm.off_policy.level", "algorithm.off_policy.capp"} <= paths
    with pytest.raises(ConfigError, match=r"algorithm\.off_policy\.floor.*must be smaller than"):
        load_config(example, ["algorithm.off_policy.floor=3"], check_inputs=False)
