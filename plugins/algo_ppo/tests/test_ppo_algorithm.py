"""The PPO step with real workers in this process (FSDP policy/reference/critic/reward,
transformers rollout engine; world size 1, no Ray): what each role gets, what changes,
residency of colocated roles, critic warm-up, ptx, state."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("rlweave_backend_fsdp")
pytest.importorskip("rlweave_infer_hf")

from rlweave.config.schema import RunConfig  # noqa: E402
from rlweave.interfaces.algorithm import RunContext  # noqa: E402
from rlweave.interfaces.worker import WorkerContext  # noqa: E402
from rlweave.scheduler.handle import RoleHandle  # noqa: E402
from rlweave.scheduler.local import LocalWorkerGroup  # noqa: E402

ALL_ROLES = ["policy", "rollout", "reference", "critic", "reward"]


class CharTokenizer:
    eos_token_id = 2
    eos_token = "</s>"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [3 + (ord(ch) % 120) for ch in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + (i % 26)) for i in ids if not (skip_special_tokens and i == self.eos_token_id))


class Recorder:
    """Wraps a role handle and records the calls made on it (names and batch sizes)."""

    def __init__(self, handle):
        self.h, self.calls = handle, []

    def __getattr__(self, name):
        attr = getattr(self.h, name)
        if not callable(attr):
            return attr

        def wrapped(*a, **k):
            self.calls.append((name, a, k))
            return attr(*a, **k)

        return wrapped


def _role(name, path, model_type=None, lr=None, port=0):
    if name == "rollout":
        from rlweave_infer_hf.engine import HFEngine

        ctx = WorkerContext(role=name, options={"max_batch_size": 16}, model={"path": path}, seed=5)
        group = LocalWorkerGroup(name, HFEngine, [ctx])
        group.workers[0].init_engine()
    else:
        from rlweave_backend_fsdp.worker import FSDPWorker

        ctx = WorkerContext(role=name, master_port=port, options={"max_tokens_per_micro_batch": 128},
                            model={"path": path, "model_type": model_type}, seed=5,
                            extra={"optim": {"lr": lr, "grad_clip": 1.0}} if lr else {})
        group = LocalWorkerGroup(name, FSDPWorker, [ctx])
        group.workers[0].init_model()
    return Recorder(RoleHandle(name, group))


def _context(roles, tmp_path, config, seed, **kw):
    """A run context whose weight syncs copy in process (the roles are in-process groups)."""
    from rlweave.weight_sync.in_process import InProcessTransport
    from rlweave.weight_sync import WeightSync

    return RunContext(roles=roles, tokenizer=CharTokenizer(), run_dir=tmp_path, config=config, seed=seed,
                      weight_sync=WeightSync(roles, transport_factory=lambda _s, _d: InProcessTransport()), **kw)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from rlweave.testing.tiny_model import build_tiny_qwen2

    return str(build_tiny_qwen2(tmp_path_factory.mktemp("ppo") / "m", vocab_size=128, hidden=32, layers=2, heads=4,
                                kv_heads=2, ffn=64, seed=2))


@pytest.fixture()
def roles(model_dir):
    from rlweave.testing.ranks import free_port

    port = free_port()
    built = {
        "policy": _role("policy", model_dir, "causal_lm", 1e-3, port),
        "reference": _role("reference", model_dir, "causal_lm", None, port),
        "critic": _role("critic", model_dir, "value", 1e-3, port),
        "reward": _role("reward", model_dir, "reward", None, port),
        "rollout": _role("rollout", model_dir),
    }
    yield built
    for r in built.values():  # the FSDP workers' shutdown ends the process group they share
        r.h.shutdown()


def _weights(h):
    return {k: v.clone() for k, v in h.h.group.workers[0].named_weights()}


def _changed(a, b):
    return any(not torch.equal(a[k], b[k]) for k in a)


def _records(n=4):
    return [{"id": f"q{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(n)]


def _algo(roles, tmp_path, colocate=False, **cfg):
    from rlweave_algo_ppo.algorithm import PPO

    rc = RunConfig(resources={"colocate": [ALL_ROLES]} if colocate else {})
    ctx = _context(roles, tmp_path, rc, 11)
    base = {"name": "ppo", "n_samples": 2, "max_new_tokens": 6, "ppo_epochs": 2, "mini_batches": 2, "kl": {"beta": 0.1}}
    algo = PPO({**base, **cfg}, ctx)
    algo.setup()
    return algo


def test_ppo_step_separate_pools(roles, tmp_path):
    w_pol, w_ref, w_cri = _weights(roles["policy"]), _weights(roles["reference"]), _weights(roles["critic"])
    algo = _algo(roles, tmp_path, kl={"beta": 0.1, "target": 1.0, "horizon": 100})
    m = algo.step(_records())
    for key in ("reward/mean", "reward/reward", "kl_reward", "kl_coef", "value_loss", "explained_variance", "pg_loss",
                "clip_frac", "entropy", "adv/mean", "returns/mean", "response_len/mean", "time/generate",
                "time/reward", "time/reference", "time/values", "time/old_logprobs", "time/train", "time/critic_train",
                "time/sync"):
        assert key in m, key
    assert all(math.isfinite(v) for k, v in m.items() if k != "explained_variance")
    assert m["samples"] == 8.0 and m["kl_coef"] == pytest.approx(0.1)
    assert algo.kl.coef != 0.1  # adaptive controller moved
    # 2 epochs x 2 mini-batches: 4 optimizer steps per trained role
    assert [c[0] for c in roles["policy"].calls].count("train") == 4
    assert [c[0] for c in roles["critic"].calls].count("train") == 4
    assert [c[0] for c in roles["reward"].calls] == ["scores"]
    sb = roles["reward"].calls[0][1][0]
    assert all(s[-1].item() == 2 for s in sb.sequences())  # reward model reads an EOS-closed response
    # every mini-batch's token weights sum to 1 (token mean)
    for name, args, _ in roles["critic"].calls:
        if name == "train":
            assert float(args[0].token["token_weight"].sum()) == pytest.approx(1.0)
    assert _changed(w_pol, _weights(roles["policy"])) and _changed(w_cri, _weights(roles["critic"]))
    assert not _changed(w_ref, _weights(roles["reference"]))
    # rollout got the policy's new weights
    pol = dict(roles["policy"].h.group.workers[0].named_weights())
    rol = dict(roles["rollout"].h.group.workers[0].model.named_parameters())
    assert torch.equal(pol["model.embed_tokens.weight"], rol["model.embed_tokens.weight"])
    assert algo.kit.residency.moves == []  # nothing colocated: nothing moved
    state = json.loads(json.dumps(algo.state_dict()))
    algo2 = _algo(roles, tmp_path, kl={"beta": 0.1, "target": 1.0, "horizon": 100})
    algo2.load_state_dict(state)
    assert algo2.kl.coef == algo.kl.coef and algo2.steps_done == 1


def test_ppo_colocated_moves_roles_and_warms_up_critic(roles, tmp_path):
    w_pol, w_cri = _weights(roles["policy"]), _weights(roles["critic"])
    algo = _algo(roles, tmp_path, colocate=True, critic_warmup_steps=1, ppo_epochs=1, mini_batches=1)
    moves_setup = list(algo.kit.residency.moves)
    m = algo.step(_records())
    assert "pg_loss" not in m and "value_loss" in m
    assert not _changed(w_pol, _weights(roles["policy"]))  # critic warm-up: policy untouched
    assert _changed(w_cri, _weights(roles["critic"]))
    moves = algo.kit.residency.moves[len(moves_setup):]
    assert ("sync", "critic", "out") in moves_setup and ("sync", "reward", "out") in moves_setup
    assert ("generate", "policy", "out") in moves
    assert ("experience", "rollout", "out") in moves and ("experience", "reward", "in") in moves
    assert ("train", "reward", "out") in moves and ("train", "reference", "out") in moves
    m2 = algo.step(_records())
    assert "pg_loss" in m2 and _changed(w_pol, _weights(roles["policy"]))
    # trained one at a time: the critic was put away while the policy trained, and back after
    later = algo.kit.residency.moves[len(moves_setup) + len(moves):]
    assert ("train", "critic", "out") in later and ("train", "policy", "out") in later


def test_ppo_ptx_term(roles, tmp_path):
    ptx = tmp_path / "ptx.jsonl"
    ptx.write_text("\n".join(json.dumps({"query": f"{i}+1=", "response": str(i + 1)}) for i in range(6)))
    algo = _algo(roles, tmp_path, ppo_epochs=1, mini_batches=1, ptx_coef=0.5, ptx_data=str(ptx), ptx_batch_size=3)
    m = algo.step(_records(2))
    assert m["ptx_loss"] > 0
    (name, args, _), = [c for c in roles["policy"].calls if c[0] == "train"]
    b = args[0]
    assert len(b) == 4 + 3 and sum(i.startswith("ptx:") for i in b.ids) == 3
    assert float(b.token["ptx_weight"].sum()) == pytest.approx(1.0)
    assert float(b.token["token_weight"].sum()) == pytest.approx(1.0)
    (vname, vargs, _), = [c for c in roles["critic"].calls if c[0] == "train"]
    assert len(vargs[0]) == 4  # the critic never sees ptx samples
    assert algo.state_dict()["ptx"] is not None


class _LikesEarlyLetters:
    """A rule reward set: the share of response characters in 'a'..'m' (half the vocabulary)."""

    entries = [object()]

    def score(self, samples):
        vals = [sum(ch <= "m" for ch in s["response"]) / max(1, len(s["response"])) for s in samples]
        return vals, [{"early": v} for v in vals]


def test_ppo_learns_to_raise_a_reward(roles, tmp_path):
    """Rule reward only (no reward model role): the reward rises within a few steps."""
    from rlweave_algo_ppo.algorithm import PPO

    roles = {k: v for k, v in roles.items() if k != "reward"}
    worker = roles["policy"].h.group.workers[0]  # a tiny random model: learn fast
    worker.scheduler.base_lrs = [1e-2 for _ in worker.scheduler.base_lrs]
    ctx = _context(roles, tmp_path, RunConfig(), 1, rewards=_LikesEarlyLetters())
    algo = PPO({"name": "ppo", "reward_models": [], "n_samples": 4, "max_new_tokens": 6, "kl": {"beta": 0.0},
                "ppo_epochs": 2, "mini_batches": 1, "temperature": 1.0}, ctx)
    algo.setup()
    rewards = [algo.step(_records(8))["reward/mean"] for _ in range(8)]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, rewards


def test_ppo_one_step_off_trains_one_version_old_samples_and_drains(roles, tmp_path):
    """``run.mode: one_step_off``: the next step's prompts are generated before this step
    trains; from the second step every trained token is one version old, the reward model,
    reference and critic score the trained batch itself, the queue is in the state, and
    ``drain()`` leaves nothing in flight."""
    from rlweave_algo_ppo.algorithm import PPO

    rc = RunConfig.model_validate({"run": {"mode": "one_step_off", "max_staleness": 1, "total_steps": 3},
                                   "data": {"batch_size": 4}})
    batches = iter([_records()[2:] + _records(2), _records(), _records()])
    ctx = _context(roles, tmp_path, rc, 11, next_records=lambda: next(batches, []))
    algo = PPO({"name": "ppo", "n_samples": 2, "max_new_tokens": 4, "ppo_epochs": 1, "mini_batches": 1,
                "off_policy": {"correction": "tis", "cap": 2.0}}, ctx)
    algo.setup()
    first = algo.step(_records())
    assert first["staleness/max"] == 0.0 and first["samples"] == 8.0
    gens = [c for c in roles["rollout"].calls if c[0] == "generate"]
    assert len(gens) == 2, "the second step's prompts were sent before the first step trained"
    second = algo.step(_records()[2:] + _records(2))
    assert second["staleness/mean"] == second["staleness/max"] == 1.0 and second["samples"] == 8.0
    assert "offpolicy/weight_mean" in second or any(k.startswith("offpolicy/") for k in second)
    scored = [len(c[1][0]) for c in roles["reward"].calls if c[0] == "scores"]
    assert scored == [8, 8]
    assert json.loads(json.dumps(algo.state_dict()))["pipeline"]["groups"] is not None
    algo.drain()
    assert not algo.kit.pipeline.queue.in_flight and algo.kit.pipeline.pending_sync is None
