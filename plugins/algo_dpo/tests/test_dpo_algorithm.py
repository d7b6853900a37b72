"""DPO and OnlineDPO steps on a tiny random Qwen2, driven in this process: real FSDP
workers (world size 1) and the HF rollout engine behind role handles on
``LocalWorkerGroup`` (no Ray). The slow end-to-end runs through ``rlweave train`` are in
``test_dpo_e2e.py``."""

from __future__ import annotations

import json
import math
import socket

import pytest
import torch

pytest.importorskip("rlweave_backend_fsdp")

from rlweave.config.schema import RunConfig  # noqa: E402
from rlweave.interfaces.algorithm import RunContext  # noqa: E402
from rlweave.interfaces.worker import WorkerContext  # noqa: E402
from rlweave.scheduler.handle import RoleHandle  # noqa: E402
from rlweave.scheduler.local import LocalWorkerGroup  # noqa: E402

PAIRS = [(1, 2), (3, 4), (2, 2), (5, 1), (6, 3), (4, 4)]
RECORDS = [{"id": i, "prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}
           for i, (a, b) in enumerate(PAIRS)]


class CharTok:
    """Character tokenizer matching the tiny model's 128-token vocabulary (EOS = 1)."""

    eos_token_id = 1
    eos_token = "\x01"
    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) % 128 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i != 1)


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rlweave.testing.tiny_model import build_tiny_qwen2

    d = tmp_path_factory.mktemp("dpo_tiny")
    build_tiny_qwen2(d / "model", vocab_size=128)
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return d


def fsdp_role(name, model_dir, budget=4096, optim=True, share=True):
    from rlweave_backend_fsdp.worker import FSDPWorker

    ctx = WorkerContext(role=name, master_port=_port(), model={"path": str(model_dir)},
                        options={"max_tokens_per_micro_batch": budget, "share_prompts": share},
                        extra={"optim": {"lr": 1e-3}} if optim else {})
    h = RoleHandle(name, LocalWorkerGroup(name, FSDPWorker, [ctx]))
    h.call("init_model").result()
    return h


def run_config(tiny, budget=4096):
    return RunConfig.model_validate({
        "data": {"train": str(tiny / "train.jsonl")},
        "roles": {"policy": {"backend": "fsdp", "options": {"max_tokens_per_micro_batch": budget}}},
    })


def params(h):
    return {k: v.detach().clone() for k, v in h.group.workers[0].named_weights()}


def shutdown(*handles):
    for h in handles:
        h.shutdown()


def dpo_run(tiny, tmp_path, steps=3, budget=4096, records=RECORDS, share=True, **algo):
    from rlweave_algo_dpo.dpo import DPO

    policy = fsdp_role("policy", tiny / "model", budget, share=share)
    roles = {"policy": policy}
    if algo.get("reference_mode") == "live":
        roles["reference"] = fsdp_role("reference", tiny / "model", optim=False)
    algo_obj = DPO({"beta": 0.5, **algo}, RunContext(roles=roles, tokenizer=CharTok(), run_dir=tmp_path,
                                                     config=run_config(tiny, budget)))
    try:
        before = params(policy)
        metrics = [algo_obj.step(list(records)) for _ in range(steps)]
        after = params(policy)
    finally:
        shutdown(*roles.values())
    return algo_obj, metrics, before, after


def test_dpo_steps_learn_preferences(tiny, tmp_path):
    algo, ms, before, after = dpo_run(tiny, tmp_path, sft_coef=0.1)
    # the policy starts equal to the reference: the sigmoid loss is log 2 and all rewards 0
    assert ms[0]["dpo_loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert ms[0]["rewards/margin"] == pytest.approx(0.0, abs=1e-4)
    assert all(math.isfinite(m["loss"]) for m in ms)
    assert ms[-1]["dpo_loss"] < ms[0]["dpo_loss"] - 0.1
    assert ms[-1]["rewards/margin"] > 0 and ms[-1]["rewards/accuracy"] == 1.0
    assert ms[-1]["pairs"] == len(RECORDS)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # precomputed reference log-probs: cached on disk, reloaded on resume, never recomputed
    state = algo.state_dict()
    assert state["steps"] == 3 and (tmp_path / "dpo_reference_logps.json").exists()
    from rlweave_algo_dpo.dpo import DPO

    again = DPO({"beta": 0.5}, RunContext(roles={}, tokenizer=CharTok(), run_dir=tmp_path, config=run_config(tiny)))
    again.load_state_dict(json.loads(json.dumps(state)))
    assert again.ref_cache == algo.ref_cache and len(again.ref_cache) == len(RECORDS)
    (tmp_path / "dpo_reference_logps.json").unlink()
    with pytest.raises(FileNotFoundError, match="cannot be recomputed"):
        again.load_state_dict(state)


def test_split_pairs_match_whole_pairs(tiny, tmp_path):
    """A token budget that puts every sample in its own micro-batch (pairs split, prompt
    sharing off) gives the same losses as one micro-batch, thanks to the partner log-ratios;
    without them it fails. With prompt sharing, the same budget keeps each pair together
    (its prompt counted once), with the same losses."""
    few = RECORDS[:3]
    _, whole, _, _ = dpo_run(tiny, tmp_path / "a", steps=2, records=few)
    _, split, _, _ = dpo_run(tiny, tmp_path / "b", steps=2, budget=8, records=few, share=False)
    _, pairs, _, _ = dpo_run(tiny, tmp_path / "d", steps=2, budget=8, records=few)
    assert whole[0]["num_micro_batches"] == 1 and split[0]["num_micro_batches"] == 2 * len(few)
    assert pairs[0]["num_micro_batches"] == len(few)
    for w, s, p in zip(whole, split, pairs):
        assert s["dpo_loss"] == pytest.approx(w["dpo_loss"], abs=1e-5)
        assert s["rewards/margin"] == pytest.approx(w["rewards/margin"], abs=1e-5)
        assert p["dpo_loss"] == pytest.approx(w["dpo_loss"], abs=1e-5)
    from rlweave.worker_errors import WorkerError

    with pytest.raises(WorkerError, match="without its pair partner"):
        dpo_run(tiny, tmp_path / "c", steps=1, budget=8, records=few, partner_logprobs="never", share=False)


def test_live_reference_equals_precompute(tiny, tmp_path):
    _, pre, _, _ = dpo_run(tiny, tmp_path / "a", steps=2, loss_type="ipo")
    _, live, _, _ = dpo_run(tiny, tmp_path / "b", steps=2, loss_type="ipo", reference_mode="live")
    for p, q in zip(pre, live):
        assert q["dpo_loss"] == pytest.approx(p["dpo_loss"], abs=1e-5)
    assert pre[0]["dpo_loss"] == pytest.approx((1 / (2 * 0.5)) ** 2, abs=1e-4)  # IPO at h = 0


class ScoreByChars:
    """Rule-style reward set: prompts containing 'tie' give every sample 1.0 (a tied
    prompt); others score each response by a hash of its characters (ties improbable)."""

    def __init__(self):
        self.calls = []

    def score(self, samples):
        self.calls.append(samples)
        out = [1.0 if "tie" in s["prompt"] else float(sum(map(ord, s["response"])) % 97) for s in samples]
        return out, [{} for _ in samples]


def test_online_dpo_step(tiny, tmp_path):
    from rlweave_algo_dpo import online_dpo
    from rlweave_infer_hf.engine import HFEngine

    from rlweave.weight_sync.in_process import InProcessTransport
    from rlweave.weight_sync import WeightSync

    class CountingTransport(InProcessTransport):
        setups = 0

        def setup(self, src, dst):
            self.setups += 1
            super().setup(src, dst)

    transport = CountingTransport()  # the roles are in-process groups: no object store
    policy = fsdp_role("policy", tiny / "model")
    reference = fsdp_role("reference", tiny / "model", optim=False)
    rollout = RoleHandle("rollout", LocalWorkerGroup("rollout", HFEngine, [
        WorkerContext(role="rollout", model={"path": str(tiny / "model")}, seed=0)]))
    rollout.call("init_engine").result()
    rewards = ScoreByChars()
    roles = {"policy": policy, "reference": reference, "rollout": rollout}
    records = [{"id": i, "prompt": p, "answer": "x"} for i, p in enumerate(["1+2=", "tie 3+4=", "5+5=", "tie 1+1="])]
    algo = online_dpo.OnlineDPO({"beta": 0.5, "n_samples": 4, "max_new_tokens": 6},
                                RunContext(roles=roles, tokenizer=CharTok(), run_dir=tmp_path, config=run_config(tiny),
                                           rewards=rewards, seed=3,
                                           weight_sync=WeightSync(roles, transport_factory=lambda _s, _d: transport)))
    algo.setup()
    before = params(policy)
    m1 = algo.step(records)
    m2 = algo.step(records)
    after = params(policy)
    shutdown(policy, reference, rollout)
    assert m1["tied_prompts"] >= 2 and m1["pairs"] + m1["tied_prompts"] + m1["too_few_samples"] == 4
    assert m1["pairs"] >= 1 and m1["skipped_update"] == 0.0
    assert m1["reward/chosen"] > m1["reward/rejected"]
    assert m1["dpo_loss"] == pytest.approx(math.log(2), abs=1e-4)  # policy == reference at step 1
    assert math.isfinite(m2["loss"]) and m2["tied_prompts_total"] == m1["tied_prompts"] + m2["tied_prompts"]
    assert transport.syncs == 3 and transport.setups == 1  # before the first generation, then after each update
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # 4 prompts x 4 samples scored per step, with the record's extra fields
    assert len(rewards.calls[0]) == 16 and rewards.calls[0][0]["answer"] == "x"
    assert algo.state_dict() == {"format": 2, "steps_done": 2, "samples_seen": 32, "pipeline": {},
                                 "tied_total": int(m2["tied_prompts_total"])}
