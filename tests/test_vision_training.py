"""Vision-language models through the HF engine and the FSDP backend: what the engine samples from
prompts with images is what the trainer scores, with the same log-probs; packing and the other
samples' images change nothing; a rank without images still steps; a frozen vision tower stays
frozen and out of the optimizer and the weight sync."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlweave.testing.helper_modules import import_helper
from rlweave.testing.ranks import run_ranks

sc = import_helper(Path(__file__).with_name("vision_scenarios.py"))


@pytest.fixture(scope="module")
def vlm(tmp_path_factory) -> str:
    return sc.build_model(str(tmp_path_factory.mktemp("vlm") / "model"))


@pytest.fixture(scope="module")
def one_rank(vlm) -> dict:
    return run_ranks(sc.engine_and_trainer, 1, vlm)


def _response(r: dict, key: str) -> torch.Tensor:
    return r[key][r["mask"] > 0]


def test_sampled_ids_are_trained_ids(one_rank):
    assert one_rank["sampled"] == one_rank["trained"]
    assert all(len(s) > 0 for s in one_rank["sampled"])


def test_engine_logprobs_equal_trainer_logprobs(one_rank):
    trainer, engine = _response(one_rank, "packed"), _response(one_rank, "engine")
    assert torch.allclose(trainer, engine, atol=1e-5, rtol=0), (trainer - engine).abs().max()


def test_trainer_logprobs_equal_transformers_per_sample(one_rank):
    # every token, prompt included: image tokens, M-RoPE positions and the text after the images
    assert torch.allclose(one_rank["packed"], one_rank["reference"], atol=1e-5, rtol=0)


def test_packed_equals_unpacked(one_rank):
    assert torch.allclose(one_rank["packed"], one_rank["alone"], atol=1e-6, rtol=0)


def test_another_samples_image_changes_nothing_else(one_rank):
    cu = one_rank["cu"].tolist()
    first, third = slice(cu[0], cu[2]), slice(cu[2], cu[3])
    assert torch.equal(one_rank["changed"][first], one_rank["packed"][first])
    assert not torch.allclose(one_rank["changed"][third], one_rank["packed"][third])  # the control: it did change


@pytest.mark.parametrize("backend,options", [("fsdp", {}), ("deepspeed", {"zero_stage": 3})], ids=["fsdp", "deepspeed"])
def test_rank_without_images_steps_and_frozen_tower_stays(vlm, backend, options):
    r = run_ranks(sc.two_ranks_frozen, 2, vlm, backend, options)
    assert r["tower"], "the model has a vision tower"
    assert torch.isfinite(torch.tensor(r["loss"]))
    assert r["tower_same"] and r["text_changed"]
    assert not r["tower_in_optim"] and r["text_in_optim"]
    assert r["synced_tower"] == [] and r["synced"] > 0


def test_sequence_parallel_equals_one_rank_with_an_image_cut_by_the_shard_boundary(vlm):
    two = run_ranks(sc.sp_logprobs, 2, vlm)
    assert two["middle"] - 1 in two["image_tokens"] and two["middle"] in two["image_tokens"]  # the cut is in an image
    b = sc.batch_of(sc.prompts(vlm), sc.SP_RESPONSES)
    one = sc.reference(vlm, b)  # one process, one sample per forward: what sp=1 gives (test_trainer_logprobs...)
    assert torch.allclose(one[: len(two["two"])], two["two"], atol=1e-5, rtol=0)
    assert torch.allclose(one, two["all"], atol=1e-5, rtol=0)
    assert 0 < two["loss"] < 10


def test_lora_adapts_the_language_model_only_and_trains_on_images(vlm):
    r = run_ranks(sc.lora_step, 1, vlm)
    assert r["adapted"] and not any(".visual." in f".{n}" for n in r["adapted"])
    assert any("language_model" in n for n in r["adapted"])
    assert r["moved"] and torch.allclose(r["base"], r["before"], atol=1e-6, rtol=0)  # adapters off = the base model


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_engine_and_trainer_agree_on_the_gpu(vlm, record_property):
    r = run_ranks(sc.engine_and_trainer, 1, vlm, device="cuda")
    trainer, engine = _response(r, "packed"), _response(r, "engine")
    gap = float((trainer - engine).abs().max())
    record_property("key_figure", f"VLM engine vs trainer log-probs on cuda (fp32): max |diff| {gap:.1e}")
    assert r["sampled"] == r["trained"]
    assert gap < 1e-4 and torch.allclose(r["packed"], r["alone"], atol=1e-5, rtol=0)
