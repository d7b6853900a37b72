"""SFT smoke test on a tiny model in one process (real FSDP worker, no Ray): the loss is
finite and falls, parameters change, only response tokens are trained, and evaluation
(greedy decoding of a saved HF copy of the policy) reports exact match."""

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from rlweave.interfaces.algorithm import RunContext
from rlweave.interfaces.worker import WorkerContext
from rlweave.scheduler.handle import RoleHandle
from rlweave.scheduler.local import LocalWorkerGroup

REPO = Path(__file__).resolve().parents[3]


def _build_model(out: Path) -> Path:
    spec = importlib.util.spec_from_file_location("arith_build_model", REPO / "examples/arith/build_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(out, out / "no-data", hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, max_positions=64)


def test_sft_learns_a_tiny_set(tmp_path):
    from rlweave_algo_sft.algorithm import SFT
    from rlweave_algo_sft.config import SFTConfig
    from rlweave_backend_fsdp.worker import FSDPWorker
    from transformers import AutoTokenizer

    model_dir = _build_model(tmp_path / "model")
    tok = AutoTokenizer.from_pretrained(model_dir)
    ctx_w = WorkerContext(role="policy", model={"path": str(model_dir), "dtype": "float32"}, seed=0,
                          master_port=29741, extra={"optim": {"lr": 2e-2, "grad_clip": 1.0}})
    policy = RoleHandle("policy", LocalWorkerGroup("policy", FSDPWorker, [ctx_w]))
    policy.call("init_model").result()
    try:
        algo = SFT(SFTConfig(eval_max_new_tokens=4), RunContext(roles={"policy": policy}, tokenizer=tok,
                                                                run_dir=tmp_path, config=None, seed=0))
        records = [{"id": str(i), "query": q, "response": r}
                   for i, (q, r) in enumerate([("1+1=", "2"), ("2+3=", "5"), ("7-4=", "3"), ("9+9=", "18")])]
        batch = algo.build_batch(records)
        # only the response and its EOS are trained: 1+1+1+2 digits + 4 EOS
        assert int(batch.token["loss_mask"].sum()) == 9
        assert float(batch.token["token_weight"].sum()) == pytest.approx(1.0)
        before = {n: t.clone() for n, t in policy.group.workers[0].named_weights()}
        acc0 = algo.evaluate(records)["accuracy"]
        losses = [algo.step(records)["loss"] for _ in range(40)]
        after = dict(policy.group.workers[0].named_weights())
        acc1 = algo.evaluate(records)["accuracy"]
    finally:
        policy.shutdown()
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.25 * losses[0], losses
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert acc0 == 0.0 and acc1 == 1.0, (acc0, acc1)
