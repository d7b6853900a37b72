"""GRPO smoke test on a tiny model, in one process (no Ray): the real FSDP worker trains,
the real HF engine generates, a real RewardSet scores in worker processes.

Checks: the loss is finite, the policy's parameters changed, the rollout engine received
the new weights, and the reward function was called with the data record's extra fields.
"""

import importlib.util
import json
import math
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlweave.interfaces.algorithm import RunContext
from rlweave.interfaces.worker import WorkerContext
from rlweave.rewards.sections import RewardEntry, RewardsRuntime
from rlweave.scheduler.handle import RoleHandle
from rlweave.scheduler.local import LocalWorkerGroup
from rlweave.testing.ranks import free_port
from rlweave.weight_sync import WeightSync
from rlweave.weight_sync.in_process import InProcessTransport

REPO = Path(__file__).resolve().parents[3]


def _build_model(out: Path) -> Path:
    spec = importlib.util.spec_from_file_location("arith_build_model", REPO / "examples/arith/build_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(out, out / "no-data", hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, max_positions=64)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grpo_smoke")
    model_dir = _build_model(tmp / "model")
    # a user reward module that records what it was called with
    (tmp / "grpo_probe_reward.py").write_text(textwrap.dedent('''
        import json, os
        def probe(prompt, response, answer, level, log, **kw):
            with open(log, "a") as f:
                f.write(json.dumps({"prompt": prompt, "response": response, "answer": answer, "level": level}) + "\\n")
            return len(response) / 10.0  # varies inside a group, so advantages are non-zero
    '''))
    sys.path.insert(0, str(tmp))
    yield tmp, model_dir
    sys.path.remove(str(tmp))


class CountingTransport(InProcessTransport):
    """The in-process transport, counting its set-ups."""

    setups = 0

    def setup(self, src, dst):
        self.setups += 1


def test_grpo_step_trains_and_syncs(setup):
    from rlweave.rewards.reward_set import RewardSet
    from rlweave_algo_grpo.algorithm import GRPO
    from rlweave_algo_grpo.config import GRPOConfig
    from rlweave_backend_fsdp.worker import FSDPWorker
    from rlweave_infer_hf.engine import HFEngine
    from transformers import AutoTokenizer

    tmp, model_dir = setup
    model = {"path": str(model_dir), "dtype": "float32", "model_type": "causal_lm"}
    pctx = WorkerContext(role="policy", model=model, seed=3, master_port=free_port(),
                         extra={"optim": {"lr": 5e-2, "grad_clip": 1.0}})
    policy = RoleHandle("policy", LocalWorkerGroup("policy", FSDPWorker, [pctx]))
    rollout = RoleHandle("rollout", LocalWorkerGroup("rollout", HFEngine, [WorkerContext(role="rollout", model=model, seed=3)]))
    policy.call("init_model").result()
    rollout.call("init_engine").result()
    log = tmp / "calls.jsonl"
    rewards = RewardSet([RewardEntry(name="grpo_probe_reward:probe", args={"log": str(log)})],
                        RewardsRuntime(timeout_s=20, workers=1))
    try:
        transport = CountingTransport()
        roles = {"policy": policy, "rollout": rollout}
        ctx = RunContext(roles=roles, tokenizer=AutoTokenizer.from_pretrained(model_dir),
                         run_dir=tmp, config=None, rewards=rewards, seed=3,
                         weight_sync=WeightSync(roles, transport_factory=lambda _s, _d: transport))
        cfg = GRPOConfig(n_samples=4, max_new_tokens=6, temperature=1.0, ppo_epochs=2, mini_batches=2,
                         policy_loss={"name": "ppo_clip", "clip_high": 0.28}, eval_max_new_tokens=4)
        algo = GRPO(cfg, ctx)
        algo.setup()
        before = {n: t.clone() for n, t in policy.group.workers[0].named_weights()}
        records = [{"id": f"r{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i), "level": i % 2} for i in range(4)]
        m = algo.step(records)
        after = dict(policy.group.workers[0].named_weights())
        engine_w = dict(rollout.group.workers[0].model.state_dict())
        metrics = algo.evaluate(records)
    finally:
        rewards.close()
        policy.shutdown()
        rollout.shutdown()

    assert math.isfinite(m["loss"]) and math.isfinite(m["pg_loss"])
    assert m["samples"] == 16 and m["reward/failed"] == 0
    # several updates per batch: old log-probs were recomputed and compared with the engine's
    assert m["logprob_gap"] < 1e-3
    for key in ("reward/mean", "reward/std", "adv/mean", "adv/std", "entropy", "clip_frac", "response_len/mean",
                "time/generate", "time/reward", "time/train", "time/sync"):
        assert key in m and math.isfinite(m[key]), key
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert changed, "no parameter changed"
    assert torch.equal(engine_w["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    # one transport for the pair, set up once, used by setup() and the step's sync
    assert transport.setups == 1 and transport.syncs >= 2
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) >= 16 + 4  # 16 training samples, then 4 evaluation answers
    by_prompt = {c["prompt"]: c for c in calls}
    assert by_prompt["3+3="]["answer"] == "6" and by_prompt["3+3="]["level"] == 1
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["n"] == 4


class CallLog:
    """Wraps a role handle and appends ``(role, method)`` of each call to a shared list."""

    def __init__(self, name, handle, log):
        self.name, self.h, self.log = name, handle, log

    def __getattr__(self, attr):
        value = getattr(self.h, attr)
        if not callable(value):
            return value

        def call(*a, **k):
            self.log.append((self.name, attr))
            return value(*a, **k)

        return call


def test_colocated_grpo_puts_idle_roles_away_in_order(setup):
    """Policy and rollout share a device: the policy is offloaded while the engine generates,
    the engine sleeps while the policy computes log-probs and trains, and both are back
    (policy onloaded first, engine woken for the sync) before the step ends."""
    from rlweave.config.schema import RunConfig
    from rlweave.rewards.reward_set import RewardSet
    from rlweave_algo_grpo.algorithm import GRPO
    from rlweave_algo_grpo.config import GRPOConfig
    from rlweave_backend_fsdp.worker import FSDPWorker
    from rlweave_infer_hf.engine import HFEngine
    from transformers import AutoTokenizer

    tmp, model_dir = setup
    model = {"path": str(model_dir), "dtype": "float32", "model_type": "causal_lm"}
    pctx = WorkerContext(role="policy", model=model, seed=3, master_port=free_port(), extra={"optim": {"lr": 1e-2}})
    policy = RoleHandle("policy", LocalWorkerGroup("policy", FSDPWorker, [pctx]))
    rollout = RoleHandle("rollout", LocalWorkerGroup("rollout", HFEngine, [WorkerContext(role="rollout", model=model,
                                                                                         seed=3)]))
    policy.call("init_model").result()
    rollout.call("init_engine").result()
    rewards = RewardSet([RewardEntry(name="grpo_probe_reward:probe", args={"log": str(tmp / "colocated.jsonl")})],
                        RewardsRuntime(timeout_s=20, workers=1))
    calls: list = []
    roles = {"policy": CallLog("policy", policy, calls), "rollout": CallLog("rollout", rollout, calls)}
    moves = {"offload", "onload", "sleep", "wake_up"}
    try:
        cfg = RunConfig.model_validate({"resources": {"colocate": [["policy", "rollout"]]}})
        ctx = RunContext(roles=roles, tokenizer=AutoTokenizer.from_pretrained(model_dir), run_dir=tmp, config=cfg,
                         rewards=rewards, seed=3,
                         weight_sync=WeightSync(roles, transport_factory=lambda _s, _d: InProcessTransport()))
        algo = GRPO(GRPOConfig(n_samples=4, max_new_tokens=6, ppo_epochs=2, mini_batches=1, eval_max_new_tokens=4),
                    ctx)
        algo.setup()
        assert [c for c in calls if c[1] in moves] == []  # both needed at rest: nothing moved
        calls.clear()
        m = algo.step([{"id": f"r{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i), "level": 0} for i in range(4)])
        step_calls = [c for c in calls if c[1] in moves | {"generate", "logprobs", "train", "submit_ranks"}]
        worker_offloaded_after = policy.group.workers[0].offloaded
        calls.clear()
        algo.evaluate([{"id": "e", "prompt": "1+1=", "answer": "2", "level": 0}])
        eval_moves = [c for c in calls if c[1] in moves]
    finally:
        rewards.close()
        policy.shutdown()
        rollout.shutdown()

    def first(call):
        return step_calls.index(call)

    assert step_calls.count(("policy", "offload")) == 1 and step_calls.count(("policy", "onload")) == 1
    assert step_calls.count(("rollout", "sleep")) == 1 and step_calls.count(("rollout", "wake_up")) == 1
    assert first(("policy", "offload")) < first(("rollout", "generate")) < first(("rollout", "sleep"))
    assert first(("rollout", "sleep")) < first(("policy", "onload")) < first(("policy", "logprobs"))
    assert first(("policy", "logprobs")) < first(("policy", "train")) < first(("rollout", "wake_up"))
    assert first(("rollout", "wake_up")) < first(("policy", "submit_ranks"))  # the sync's sending end
    assert algo.kit.residency.resident == {"policy": True, "rollout": True} and not worker_offloaded_after
    assert m["time/offload"] >= 0 and math.isfinite(m["loss"])
    assert eval_moves == [("policy", "offload"), ("policy", "onload")]  # evaluation generates alone


@pytest.mark.parametrize("dynamic_sampling", [False, True])
def test_reference_log_probs_run_while_rewards_are_scored(setup, dynamic_sampling):
    """With a reference model (kl.beta > 0) the reference and old log-prob calls are issued
    before the rewards are scored, so they overlap; with dynamic sampling (groups may still be
    dropped) only after. The step reports its dispatch/wait/pack/pool timings."""
    from rlweave.rewards.reward_set import RewardSet
    from rlweave.algo_helpers.experience import STEP_TIMES
    from rlweave_algo_grpo.algorithm import GRPO
    from rlweave_algo_grpo.config import GRPOConfig
    from rlweave_backend_fsdp.worker import FSDPWorker
    from rlweave_infer_hf.engine import HFEngine
    from transformers import AutoTokenizer

    tmp, model_dir = setup
    model = {"path": str(model_dir), "dtype": "float32", "model_type": "causal_lm"}
    pctx = WorkerContext(role="policy", model=model, seed=3, master_port=free_port(), extra={"optim": {"lr": 1e-2}})
    policy = RoleHandle("policy", LocalWorkerGroup("policy", FSDPWorker, [pctx]))
    reference = RoleHandle("reference", LocalWorkerGroup("reference", FSDPWorker, [
        WorkerContext(role="reference", model=model, seed=3, master_port=free_port())]))
    rollout = RoleHandle("rollout", LocalWorkerGroup("rollout", HFEngine, [WorkerContext(role="rollout", model=model,
                                                                                         seed=3)]))
    for h in (policy, reference):
        h.call("init_model").result()
    rollout.call("init_engine").result()
    rewards = RewardSet([RewardEntry(name="grpo_probe_reward:probe", args={"log": str(tmp / "overlap.jsonl")})],
                        RewardsRuntime(timeout_s=20, workers=1))
    calls: list = []
    roles = {"policy": CallLog("policy", policy, calls), "reference": CallLog("reference", reference, calls),
             "rollout": CallLog("rollout", rollout, calls)}
    try:
        ctx = RunContext(roles=roles, tokenizer=AutoTokenizer.from_pretrained(model_dir), run_dir=tmp, config=None,
                         rewards=CallLog("rewards", rewards, calls), seed=3,
                         weight_sync=WeightSync(roles, transport_factory=lambda _s, _d: InProcessTransport()))
        cfg = GRPOConfig(n_samples=4, max_new_tokens=6, kl={"beta": 0.05}, ppo_epochs=2,
                         dynamic_sampling=dynamic_sampling, max_resample=0, eval_max_new_tokens=4)
        algo = GRPO(cfg, ctx)
        algo.setup()
        calls.clear()
        m = algo.step([{"id": f"r{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i), "level": 0} for i in range(4)])
    finally:
        rewards.close()
        for h in (policy, reference, rollout):
            h.shutdown()

    order = [c for c in calls if c in {("reference", "logprobs"), ("policy", "logprobs"), ("rewards", "score")}]
    if dynamic_sampling:
        assert order == [("rewards", "score"), ("reference", "logprobs"), ("policy", "logprobs")]
    else:
        assert order == [("reference", "logprobs"), ("policy", "logprobs"), ("rewards", "score")]
    if not m.get("skipped"):
        assert math.isfinite(m["kl"]) and math.isfinite(m["loss"])
        expected = set(STEP_TIMES) | {"reference", "old_logprobs"}
        assert expected <= {k[5:] for k in m if k.startswith("time/")}
        assert all(m[f"time/{k}"] >= 0 for k in expected)
        assert m["time/reward/pool"] > 0 and m["time/reward/pool"] <= m["time/reward"] + 1e-9
        assert m["time/generate/wait"] + m["time/generate/pack"] <= m["time/generate"] + 1e-9
