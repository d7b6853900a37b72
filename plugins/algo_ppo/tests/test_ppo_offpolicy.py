"""PPO's actor loss (PolicyObjective with ppo_clip, as PPO builds it) with
``algorithm.off_policy`` against hand-computed values, the config key, and one PPO step on real
workers whose rollout engine samples with stale weights: the ``offpolicy/*`` metrics equal those
computed from the mini-batches the policy trained on."""

from __future__ import annotations

import math
import pickle
from types import SimpleNamespace

import pytest
import torch

from rlweave.algo_parts.offpolicy import OffPolicyConfig
from rlweave.algo_parts.objective import PolicyObjective
from rlweave.algo_parts.spec import resolve
from rlweave.data.batch import Batch

# Tokens [pA a1 a2 pB b1 b2 | ptx prompt, ptx response]: two RL samples (token mean, w = 1/4)
# and a ptx sample (token_weight 0, ptx_weight 1, zero-filled RL fields as PPO builds it).
# Advantages: A +1, B -1. Proximal (old_logprobs) probabilities 0.2 0.6 | 0.3 0.05, behaviour
# (rollout_logprobs) 0.4 0.2 | 0.2 0.5: iw = 0.5, 3.0 | 1.5, 0.1; per sequence A 1.5, B 0.15.
# Ratios to the proximal policy r = 1.0, 1.3 | 0.9, 1.0 (clip 0.2):
# pg = max(-A r, -A clip(r)) = -1.0, -1.2 (clipped), 0.9, 1.0.
PROX = [0.2, 0.6, 0.3, 0.05]
BEHAV = [0.4, 0.2, 0.2, 0.5]
RATIO = [1.0, 1.3, 0.9, 1.0]
RESP = [1, 2, 4, 5]
PTX_LOGP = math.log(0.5)


def _full(vals, ptx=0.0):
    out = torch.zeros(8)
    out[RESP] = torch.tensor(vals)
    out[7] = ptx
    return out


def _batch():
    b = Batch.from_sequences([[1, 2, 3], [4, 5, 6], [7, 8]], prompt_lens=[1, 1, 1])
    b.add_token("token_weight", _full([0.25] * 4))
    b.add_token("advantages", _full([1.0, 1.0, -1.0, -1.0]))
    b.add_token("old_logprobs", _full([math.log(p) for p in PROX]))
    b.add_token("rollout_logprobs", _full([math.log(p) for p in BEHAV]))
    b.add_token("ptx_weight", _full([0.0] * 4, ptx=1.0))
    return b


def policy_loss(clip_low=0.2, clip_high=0.2, **kw):
    pl = resolve("policy_loss", {"name": "ppo_clip", "clip_low": clip_low, "clip_high": clip_high})
    return PolicyObjective(policy_loss=pl, **kw)


def _run(off_policy, ptx_coef=0.0):
    logp = _full([math.log(p * r) for p, r in zip(PROX, RATIO)], ptx=PTX_LOGP).requires_grad_(True)
    loss, m = policy_loss(0.2, 0.2, ptx_coef=ptx_coef, off_policy=off_policy)(
        SimpleNamespace(logprobs=logp, entropy=None), _batch())
    loss.backward()
    return loss.item(), logp.grad, m


def test_none_is_bit_identical():
    ref_loss, ref_grad, ref_m = _run(None, ptx_coef=0.5)
    loss, grad, m = _run(OffPolicyConfig(correction="none", level="sequence", cap=1.1), ptx_coef=0.5)
    assert loss == ref_loss and torch.equal(grad, ref_grad) and m == ref_m
    # 0.25 * (-1.0 - 1.2 + 0.9 + 1.0) + 0.5 * -log(0.5)
    assert loss == pytest.approx(-0.075 + 0.5 * math.log(2))


def test_tis_token_with_ptx_tokens_left_alone():
    loss, grad, m = _run(OffPolicyConfig(correction="tis", cap=2.0), ptx_coef=0.5)
    # pg term: c = 0.5, 2.0 (3.0 truncated), 1.5, 0.1; the ptx term is not corrected
    assert loss == pytest.approx(0.25 * (-0.5 - 2.4 + 1.35 + 0.1) + 0.5 * math.log(2))
    # gradient -w c A r on unclipped tokens; the ptx token: -ptx_coef
    assert grad[RESP].tolist() == pytest.approx([-0.125, 0.0, 0.225 * 1.5, 0.025])
    assert grad[7].item() == pytest.approx(-0.5)
    # the ptx token (weight 0) is not in the statistics
    assert (m["offpolicy/iw_max"], m["offpolicy/iw_min"]) == pytest.approx((3.0, 0.1))
    assert m["offpolicy/truncated_frac"] == pytest.approx(0.25)


def test_tis_sequence():
    loss, grad, _ = _run(OffPolicyConfig(correction="tis", level="sequence", cap=2.0))
    assert loss == pytest.approx(0.25 * (1.5 * -2.2 + 0.15 * 1.9))
    assert grad[RESP].tolist() == pytest.approx([-0.375, 0.0, 0.225 * 0.15, 0.25 * 0.15])


def test_decoupled_token_and_sequence_and_floor():
    loss, grad, m = _run(OffPolicyConfig(correction="decoupled", cap=2.0))
    assert loss == pytest.approx(0.25 * (-0.5 + 1.35 + 0.1))  # 3.0 > cap: dropped
    assert grad[RESP].tolist() == pytest.approx([-0.125, 0.0, 0.3375, 0.025])
    assert m["offpolicy/masked_frac"] == pytest.approx(0.25)
    loss, grad, m = _run(OffPolicyConfig(correction="decoupled", level="sequence", cap=1.2))
    assert loss == pytest.approx(0.25 * 0.15 * 1.9)  # A (1.5 > 1.2) dropped
    assert grad[RESP].tolist() == pytest.approx([0.0, 0.0, 0.225 * 0.15, 0.25 * 0.15])
    loss, grad, m = _run(OffPolicyConfig(correction="decoupled", level="sequence", cap=2.0, floor=0.2))
    assert loss == pytest.approx(0.25 * 1.5 * -2.2)  # B (0.15 < 0.2) dropped
    assert m["offpolicy/masked_frac"] == pytest.approx(0.5)


def test_errors_and_pickle():
    b = _batch()
    del b.token["rollout_logprobs"]
    logp = torch.zeros(8)
    with pytest.raises(ValueError, match=r"algorithm\.off_policy\.correction is 'tis'.*'rollout_logprobs'"):
        policy_loss(off_policy=OffPolicyConfig(correction="tis"))(SimpleNamespace(logprobs=logp, entropy=None), b)
    fn = pickle.loads(pickle.dumps(policy_loss(0.2, 0.28, off_policy=OffPolicyConfig(correction="decoupled"))))
    assert fn.off_policy.name == "decoupled" and fn.policy_loss.options["clip_high"] == 0.28


def test_config_key():
    from pathlib import Path

    from rlweave.config.errors import ConfigError
    from rlweave.config.loader import load_config
    from rlweave_algo_ppo.config import PPOConfig

    assert PPOConfig().off_policy == OffPolicyConfig()
    assert PPOConfig.model_fields["off_policy"].description
    example = Path(__file__).resolve().parents[3] / "examples/arith/ppo.yaml"
    _, resolved = load_config(example, ["algorithm.off_policy.correction=decoupled"], check_inputs=False)
    assert resolved.algorithm_config.off_policy.name == "decoupled"
    with pytest.raises(ConfigError) as exc:
        load_config(example, ["algorithm.off_policy.cap=-1", "algorithm.off_policy.correction=truncated"],
                    check_inputs=False)
    assert {"algorithm.off_policy.cap", "algorithm.off_policy.correction"} <= {i.path for i in exc.value.issues}


# ----------------------------------------------------------------- one PPO step
class CharTokenizer:
    eos_token_id = 2
    eos_token = "</s>"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [3 + (ord(ch) % 120) for ch in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + (i % 26)) for i in ids if not (skip_special_tokens and i == self.eos_token_id))


class LikesEarlyLetters:
    """A rule reward set: the share of response characters in 'a'..'m'."""

    entries = [object()]

    def score(self, samples):
        vals = [sum(ch <= "m" for ch in s["response"]) / max(1, len(s["response"])) for s in samples]
        return vals, [{"early": v} for v in vals]


class TrainCalls:
    """Wraps the policy's role handle and keeps the batch, loss and future of each ``train`` call,
    and the batch of each ``logprobs`` call."""

    def __init__(self, handle):
        self.h, self.train_calls, self.logprob_calls = handle, [], []

    def __getattr__(self, name):
        return getattr(self.h, name)

    def logprobs(self, batch, **kw):
        self.logprob_calls.append(batch)
        return self.h.logprobs(batch, **kw)

    def train(self, batch, loss_fn):
        fut = self.h.train(batch, loss_fn)
        self.train_calls.append((batch, loss_fn, fut))
        return fut


@pytest.fixture()
def stale_roles(tmp_path):
    pytest.importorskip("rlweave_backend_fsdp")
    pytest.importorskip("rlweave_infer_hf")
    from rlweave.interfaces.worker import WorkerContext
    from rlweave.scheduler.handle import RoleHandle
    from rlweave.scheduler.local import LocalWorkerGroup
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave.testing.ranks import free_port
    from rlweave_backend_fsdp.worker import FSDPWorker
    from rlweave_infer_hf.engine import HFEngine

    path = str(build_tiny_qwen2(tmp_path / "m", vocab_size=128, hidden=32, layers=2, heads=4, kv_heads=2, ffn=64,
                                seed=2))
    port = free_port()
    roles = {}
    for name, kind, lr in (("policy", "causal_lm", 1e-3), ("critic", "value", 1e-3)):
        # a small micro-batch budget: each mini-batch spans several micro-batches
        ctx = WorkerContext(role=name, master_port=port, options={"max_tokens_per_micro_batch": 24},
                            model={"path": path, "model_type": kind}, seed=5,
                            extra={"optim": {"lr": lr, "grad_clip": 1.0}})
        group = LocalWorkerGroup(name, FSDPWorker, [ctx])
        group.workers[0].init_model()
        roles[name] = RoleHandle(name, group)
    ctx = WorkerContext(role="rollout", options={"max_batch_size": 16}, model={"path": path}, seed=5)
    group = LocalWorkerGroup("rollout", HFEngine, [ctx])
    group.workers[0].init_engine()
    roles["rollout"] = RoleHandle("rollout", group)
    roles["policy"] = TrainCalls(roles["policy"])
    yield roles
    for h in roles.values():
        h.shutdown()


def test_ppo_step_reports_offpolicy_metrics_of_a_stale_engine(stale_roles, tmp_path):
    from rlweave.config.schema import RunConfig
    from rlweave.interfaces.algorithm import RunContext
    from rlweave.weight_sync.in_process import InProcessTransport
    from rlweave.weight_sync import WeightSync
    from rlweave_algo_ppo.algorithm import PPO

    roles = stale_roles
    sync = WeightSync(roles, transport_factory=lambda _s, _d: InProcessTransport())
    ctx = RunContext(roles=roles, tokenizer=CharTokenizer(), run_dir=tmp_path, config=RunConfig(), seed=3,
                     weight_sync=sync, rewards=LikesEarlyLetters())
    off = {"correction": "tis", "level": "token", "cap": 1.1, "floor": 0.9}
    algo = PPO({"name": "ppo", "reward_models": [], "kl": {"beta": 0.0}, "n_samples": 2, "max_new_tokens": 6,
                "ppo_epochs": 2, "mini_batches": 2, "off_policy": off}, ctx)
    algo.setup()
    # the engine samples with other weights than the policy's (as after missed weight updates)
    engine = roles["rollout"].group.workers[0].model
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in engine.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    m = algo.step([{"id": f"q{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(4)])

    calls = roles["policy"].train_calls
    assert len(calls) == 4 and all(fn.off_policy == OffPolicyConfig(**off) for _, fn, _ in calls)
    # the backend folded several micro-batches per update (max and min must not be summed)
    assert all(f.result()["num_micro_batches"] > 1 for _, _, f in calls)
    iw_max, iw_min, means = [], [], {"iw_mean": [], "truncated_frac": [], "masked_frac": [], "logprob_gap": []}
    for b, _, _ in calls:
        w = b.token["token_weight"]
        on = w > 0
        gap = b.token["old_logprobs"] - b.token["rollout_logprobs"]
        iw = torch.exp(gap)
        iw_max.append(float(iw[on].max()))
        iw_min.append(float(iw[on].min()))
        means["iw_mean"].append(float((w * iw).sum()))
        means["truncated_frac"].append(float((w * (iw > 1.1)).sum()))
        means["masked_frac"].append(float((w * (iw < 0.9)).sum()))
        means["logprob_gap"].append(float((w * gap.abs()).sum()))
    assert m["offpolicy/iw_max"] == pytest.approx(max(iw_max), rel=1e-5)
    assert m["offpolicy/iw_min"] == pytest.approx(min(iw_min), rel=1e-5)
    for k, v in means.items():
        assert m[f"offpolicy/{k}"] == pytest.approx(sum(v) / len(v), rel=1e-4, abs=1e-6), k
    # the engine really is off-policy: some weights truncated, some dropped by the floor
    assert m["offpolicy/truncated_frac"] > 0 and m["offpolicy/masked_frac"] > 0
    assert m["offpolicy/iw_max"] > 1.1 and m["offpolicy/iw_min"] < 0.9
    assert all(math.isfinite(v) for k, v in m.items() if k != "explained_variance")
    # mismatch: over the trained tokens of the first pass (the first two updates), old against engine
    d = torch.cat([(b.token["old_logprobs"] - b.token["rollout_logprobs"])[b.token["token_weight"] > 0]
                   for b, _, _ in calls[:2]]).double()
    assert len(roles["policy"].logprob_calls) == 1 and m["mismatch/tokens"] == d.numel()
    assert m["mismatch/k1"] == pytest.approx(float((-d).mean()), rel=1e-4, abs=1e-6)
    assert m["mismatch/k3"] == pytest.approx(float((d.exp() - 1 - d).mean()), rel=1e-4, abs=1e-6)
    assert m["mismatch/chi2"] == pytest.approx(float((2 * d).exp().mean() - 1), rel=1e-4, abs=1e-6)
    assert m["mismatch/dlogp_abs_max"] == pytest.approx(float(d.abs().max()), rel=1e-5)
    assert m["mismatch/dlogp_abs_p50"] == pytest.approx(float(d.abs().median()), rel=0.25)
    assert m["mismatch/stale0/tokens_frac"] == 1.0  # a sync step: every token fresh
    # the engine's weights were moved under it, of the same dtype and sampling: a jump of unknown cause
    assert "unknown" in algo.kit.mismatch_monitor.warned


def test_ppo_in_bypass_mode_skips_the_old_logprobs_pass(stale_roles, tmp_path):
    from rlweave.config.schema import RunConfig
    from rlweave.interfaces.algorithm import RunContext
    from rlweave.weight_sync.in_process import InProcessTransport
    from rlweave.weight_sync import WeightSync
    from rlweave_algo_ppo.algorithm import PPO

    roles = stale_roles
    sync = WeightSync(roles, transport_factory=lambda _s, _d: InProcessTransport())
    ctx = RunContext(roles=roles, tokenizer=CharTokenizer(), run_dir=tmp_path, config=RunConfig(), seed=3,
                     weight_sync=sync, rewards=LikesEarlyLetters())
    algo = PPO({"name": "ppo", "reward_models": [], "kl": {"beta": 0.0}, "n_samples": 2, "max_new_tokens": 6,
                "ppo_epochs": 2, "mini_batches": 2, "off_policy": {"correction": "icepop", "mode": "bypass"}}, ctx)
    algo.setup()
    m = algo.step([{"id": f"q{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(4)])
    calls = roles["policy"].train_calls
    assert roles["policy"].logprob_calls == [] and "time/old_logprobs" not in m
    assert len(calls) == 4 and not any("old_logprobs" in b.token for b, _, _ in calls)
    assert all(fn.off_policy.bypass for _, fn, _ in calls)
    assert math.isfinite(m["loss"]) and m["mismatch/tokens"] > 0 and "offpolicy/iw_mean" in m
    # no reference role and no old pass: the reference's stand-in is the engine's log-probs (KL 0)
    b = calls[0][0]
    assert torch.equal(b.token["ref_logprobs"], b.token["rollout_logprobs"] * b.token["loss_mask"])
