"""Reward-model training with the real FSDP backend in this process (world size 1, no Ray):
the model learns a preference, pairwise accuracy rises, and the saved checkpoint loads as a
reward model and as a critic (head initialised from the reward model)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("rlweave_backend_fsdp")

from rlweave.interfaces.algorithm import RunContext  # noqa: E402
from rlweave.interfaces.worker import WorkerContext  # noqa: E402
from rlweave.scheduler.handle import RoleHandle  # noqa: E402
from rlweave.scheduler.local import LocalWorkerGroup  # noqa: E402


class CharTokenizer:
    """A tiny byte-level tokenizer (ids 3..), EOS = 2: enough for encode_query_response."""

    eos_token_id = 2
    eos_token = "</s>"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [3 + (ord(ch) % 120) for ch in text]}


def _fsdp_role(name: str, path: str, model_type: str, lr: float | None, port: int) -> RoleHandle:
    from rlweave_backend_fsdp.worker import FSDPWorker

    ctx = WorkerContext(role=name, rank=0, world_size=1, master_port=port, options={"max_tokens_per_micro_batch": 64},
                        model={"path": path, "model_type": model_type}, seed=3,
                        extra={"optim": {"lr": lr, "grad_clip": 1.0}} if lr else {})
    group = LocalWorkerGroup(name, FSDPWorker, [ctx])
    group.workers[0].init_model()
    return RoleHandle(name, group)


def _records(n: int, offset: int = 0):
    # prefer answers that end in "=7" over "=1": a pattern a scalar head learns quickly
    out = []
    for i in range(offset, offset + n):
        q = f"{i % 10}+{(i * 3) % 10}="
        out.append({"id": str(i), "prompt": q, "chosen": f"{i % 7} ok", "rejected": f"{i % 7} no"})
    return out


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    from rlweave.testing.tiny_model import build_tiny_qwen2

    return str(build_tiny_qwen2(tmp_path_factory.mktemp("sft") / "m", vocab_size=128, hidden=32, layers=2, heads=4,
                                kv_heads=2, ffn=64, seed=1))


def test_rm_learns_preferences_and_saves_a_loadable_reward_model(sft_dir, tmp_path):
    from rlweave.config.schema import RunConfig
    from rlweave.data.batch import Batch
    from rlweave_algo_sft.rm import RewardModelTraining
    from rlweave.testing.ranks import free_port

    port = free_port()
    policy = _fsdp_role("policy", sft_dir, "reward", 3e-3, port)
    handles = [policy]
    try:
        cfg = RunConfig(roles={"policy": {"backend": "fsdp", "model": {"path": sft_dir, "model_type": "reward"}}})
        ctx = RunContext(roles={"policy": policy}, tokenizer=CharTokenizer(), run_dir=tmp_path, config=cfg, seed=3)
        algo = RewardModelTraining({"name": "rm"}, ctx)
        held_out = _records(24, offset=1000)
        before = algo.evaluate(held_out)
        w0 = {k: v.clone() for k, v in policy.group.workers[0].named_weights()}
        ranked = {"id": "r", "query": "1+1=", "response": ["2 ok", "2 no", "2 ok!"], "score": [1.0, 0.0, 1.0]}
        losses = []
        for step in range(12):
            m = algo.step(_records(8, offset=8 * step) + ([ranked] if step % 3 == 0 else []))
            losses.append(m["loss"])
            assert m["pairs"] == (8 + 2 if step % 3 == 0 else 8)  # ranked: 2 ordered pairs, tie skipped
        after = algo.evaluate(held_out)
        assert all(x == x and abs(x) < 1e3 for x in losses)
        assert before["n"] == after["n"] == 24
        print("rm held-out before/after:", before, after)
        assert after["accuracy"] >= 0.9
        assert after["loss"] < before["loss"]
        w1 = dict(policy.group.workers[0].named_weights())
        assert any(not torch.equal(w0[k], w1[k]) for k in w0)

        # saved HF checkpoint: loads as a reward model (same scores) and as a critic whose value
        # after the last token equals the reward model's score
        out = tmp_path / "rm_hf"
        policy.save_hf(str(out)).result()
        seqs = [[3, 4, 5, 6, 2], [7, 8, 2]]
        b = Batch.from_sequences(seqs)
        want = policy.scores(b).result()
        reward = _fsdp_role("reward", str(out), "reward", None, port)
        handles.append(reward)
        assert torch.allclose(reward.scores(b).result(), want, atol=1e-5)
        critic = _fsdp_role("critic", str(out), "value", 1e-4, port)
        handles.append(critic)
        ext = Batch.from_sequences([s + [0] for s in seqs])
        vals = critic.values(ext).result()
        assert torch.allclose(vals[ext.cu_seqlens[1:] - 1], want, atol=1e-5)
    finally:
        for h in handles:  # the FSDP workers' shutdown ends the process group they share
            h.shutdown()


def test_rm_rejects_a_causal_lm_policy(sft_dir, tmp_path):
    from rlweave.config.schema import RunConfig
    from rlweave_algo_sft.rm import RewardModelTraining

    cfg = RunConfig(roles={"policy": {"backend": "fsdp", "model": {"path": sft_dir}}})
    ctx = RunContext(roles={}, tokenizer=CharTokenizer(), run_dir=tmp_path, config=cfg)
    with pytest.raises(ValueError, match="model_type: reward"):
        RewardModelTraining({"name": "rm"}, ctx)


def test_encode_pairs_dedups_ranked_responses_and_skips_long_pairs(tmp_path):
    from rlweave_algo_sft.rm import RewardModelTraining
    from rlweave_algo_sft.rm_pairs import records_to_pairs

    ctx = RunContext(roles={}, tokenizer=CharTokenizer(), run_dir=tmp_path, config=None)
    algo = RewardModelTraining({"name": "rm", "max_length": 8, "margin": "scores"}, ctx)
    recs = [{"id": "a", "query": "1+1=", "response": ["2", "3", "11"], "score": [1.0, 0.5, 0.0]},
            {"id": "b", "prompt": "2+2=", "chosen": "4", "rejected": "123456"}]  # 5 + 6 + EOS > 8 tokens
    pb = algo.encode_pairs(records_to_pairs(recs, margin_from_scores=True))
    assert len(pb) == 3 and len(pb.batch) == 3  # three pairs over three distinct sequences
    assert pb.chosen.tolist() == [0, 0, 1] and pb.rejected.tolist() == [1, 2, 2]
    assert pb.margins.tolist() == [0.5, 1.0, 0.5]
    assert pb.seqs[0] == [3 + ord(ch) % 120 for ch in "1+1=2"] + [2]
