"""How images are laid out for a vision-language model (:mod:`rlweave.data.vision`,
:class:`rlweave.interfaces.engine.VisionPrompt`, ``Batch.mm``): M-RoPE positions equal
transformers' own for one and two images, an image token sampled in a response stays text,
placeholders expand to each image's tokens, prompts with images pickle with them and are never
cut, and a batch keeps each sample's images through select, concat and split. The trainer's
vision forward encodes an image repeated in a micro-batch once, with the log-probs and tower
gradients of encoding every copy, and keeps images that differ in one pixel apart; samples that
share an image share its device copy."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from rlweave.data.batch import Batch
from rlweave.data.vision import VisionProcessor, expand_placeholders, mrope_positions
from rlweave.engine_helpers.requests import plan_requests
from rlweave.interfaces.engine import SamplingParams, VisionPrompt, prompt_images

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from rlweave.testing.tiny_vlm import build_tiny_qwen2_vl, vision_tokenizer

    path = build_tiny_qwen2_vl(tmp_path_factory.mktemp("vlm") / "m", vision_tokenizer(["abcdefghij ?:0123456789"]))
    return path, VisionProcessor(path)


def _img(h, w, seed=0):
    from PIL import Image

    return Image.fromarray((np.random.default_rng(seed).random((h, w, 3)) * 255).astype("uint8"))


@pytest.mark.parametrize("text,sizes", [(f"a{IMAGE}b:", [(32, 24)]), (f"{IMAGE}c{IMAGE}?", [(16, 32), (32, 32)])])
def test_positions_equal_transformers(vlm, text, sizes):
    from transformers import AutoConfig, Qwen2VLModel

    path, vp = vlm
    ids, mm = vp.encode(text, [_img(h, w, i) for i, (h, w) in enumerate(sizes)])
    ids = torch.tensor([ids + [5, 6, 7]])  # a response continues the text positions
    cfg = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = Qwen2VLModel(cfg)
    ref, _ = model.get_rope_index(ids, mm_token_type_ids=(ids == cfg.image_token_id).int(),
                                  image_grid_thw=mm["image_grid_thw"])
    ours, mask = mrope_positions(ids[0], mm["image_grid_thw"], cfg.image_token_id, 2, with_mask=True)
    assert torch.equal(ref[:, 0], ours)
    assert int(mask.sum()) == int((ids == cfg.image_token_id).sum())


def test_an_image_token_in_a_response_is_text(vlm):
    _, vp = vlm
    ids, mm = vp.encode(f"{IMAGE}x", [_img(16, 16)])
    tok = vp.image_token_id
    pos, mask = mrope_positions(torch.tensor(ids + [tok, 3]), mm["image_grid_thw"], tok, 2, with_mask=True)
    assert not mask[len(ids)] and mask[: len(ids)].sum() == ids.count(tok)
    assert pos[:, len(ids)].tolist() == [int(pos[0, len(ids) - 1]) + 1] * 3  # the next text position, on all rows
    with pytest.raises(ValueError, match="2 image"):
        mrope_positions(torch.tensor(ids), torch.cat([mm["image_grid_thw"]] * 2), tok, 2)


def test_placeholders_expand_to_each_images_tokens(vlm):
    _, vp = vlm
    ids = vp.tokenizer(f"q{IMAGE}{IMAGE}:")["input_ids"]
    new, mask, mm = expand_placeholders(vp, ids, [1] * len(ids), [_img(16, 16), _img(32, 32)])
    assert new.count(vp.image_token_id) == sum(vp.tokens_per_image(mm["image_grid_thw"])) == 4 + 16
    assert all(m == 0 for t, m in zip(new, mask) if t == vp.image_token_id)
    # the same ids as tokenizing the text with each placeholder written out as often as its image's tokens
    a, b = vp.tokens_per_image(mm["image_grid_thw"])
    first, middle, last = f"q{IMAGE}{IMAGE}:".split("<|image_pad|>")
    text = first + "<|image_pad|>" * a + middle + "<|image_pad|>" * b + last
    assert new == vp.tokenizer(text)["input_ids"] == vp.encode(f"q{IMAGE}{IMAGE}:", [_img(16, 16), _img(32, 32)])[0]
    with pytest.raises(ValueError, match="1 image placeholder"):
        expand_placeholders(vp, vp.tokenizer(f"{IMAGE}")["input_ids"], [0, 0, 0], [])


def test_a_prompt_with_images_pickles_with_them_and_is_never_cut():
    mm = {"pixel_values": torch.ones(4, 3), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    p = VisionPrompt([1, 2, 3], mm)
    back = pickle.loads(pickle.dumps(p))
    assert back == [1, 2, 3] and torch.equal(prompt_images(back)["pixel_values"], mm["pixel_values"])
    assert prompt_images(p + [4]) is None and prompt_images([1, 2]) is None  # a new list carries no images
    reqs = plan_requests([VisionPrompt(list(range(10)), mm), list(range(10))], SamplingParams(max_new_tokens=4),
                         max_model_len=8, long_prompt="truncate")
    assert reqs[0].error and "never cut" in reqs[0].error and reqs[0].mm is mm
    assert reqs[1].error is None and reqs[1].truncated


def test_a_batch_keeps_each_samples_images():
    b = Batch.from_sequences([[1, 2], [3, 4, 5], [6]])
    images = [{"pixel_values": torch.full((4, 2), float(i)), "image_grid_thw": torch.tensor([[1, 2, 2]])}
              for i in range(3)]
    b.set_mm([images[0], None, images[2]])
    picked = b.select([2, 1])
    assert picked.mm[0] is images[2] and picked.mm[1] is None
    whole = Batch.concat(b.split(2))
    assert [m is None for m in whole.mm] == [False, True, False]
    text = Batch.from_sequences([[7, 8]])
    mixed = Batch.concat([text, b])
    assert mixed.mm[0] is None and mixed.mm[1] is images[0] and mixed.has_images
    assert not Batch.concat([text, text]).mm
    with pytest.raises(ValueError, match="2 vision entries"):
        b.set_mm([None, None])


def _tower_and_rows(path):
    """The tiny model as the trainer loads it, its :class:`VisionForward`, and the list that the
    vision tower appends the number of pixel rows of each call to."""
    from rlweave.backend_helpers.hf_model import attention, modeling, vision

    model = modeling.load_model({"path": str(path)}, attention.register(), torch.float32, 0, backend="test")
    rows = []
    model.model.visual.register_forward_pre_hook(
        lambda mod, args, kw: rows.append(int((args[0] if args else kw["hidden_states"]).shape[0])), with_kwargs=True)
    return model, vision.for_model(model), rows


def _packed_logprobs(model, vis, seqs, mms):
    from rlweave.backend_helpers.hf_model import micro

    ids = torch.cat(seqs)
    cu = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)
    kw = {**micro.packed_inputs(ids, cu, "cpu"), **vis.inputs(ids, cu, mms, "cpu")}
    logits = model(**kw).logits[0]
    return torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[1:, None])[:, 0]


def test_an_image_repeated_in_a_micro_batch_is_encoded_once(vlm):
    path, vp = vlm
    model, vis, rows = _tower_and_rows(path)
    a_ids, a = vp.encode(f"a{IMAGE}b:", [_img(16, 16, seed=1)])
    b_ids, b = vp.encode(f"c{IMAGE}:", [_img(16, 16, seed=2)])  # the same grid, other pixels
    a_copy = {k: v.clone() for k, v in a.items()}  # equal, not the same memory
    seqs = [torch.tensor(x + r) for x, r in [(a_ids, [5, 6]), (a_ids, [7]), (b_ids, [8, 9]), (a_ids, [6, 5, 4])]]
    mms = [a, a, b, a_copy]
    patches = int(a["pixel_values"].shape[0])
    grads, lps = [], []
    for dedup in (True, False):
        vis.dedup = dedup
        model.zero_grad()
        rows.clear()
        lp = _packed_logprobs(model, vis, seqs, mms)
        lp.sum().backward()
        assert rows == [(2 if dedup else 4) * patches]
        lps.append(lp.detach())
        grads.append({n: p.grad.clone() for n, p in model.model.visual.named_parameters()})
    assert torch.allclose(lps[0], lps[1], atol=1e-6, rtol=0), (lps[0] - lps[1]).abs().max()
    assert grads[0].keys() == grads[1].keys() and any(bool(g.abs().sum() > 0) for g in grads[1].values())
    for n, g in grads[0].items():
        assert torch.allclose(g, grads[1][n], atol=1e-5, rtol=0), n
    # a sequence-parallel slice cut inside the second copy takes the same features
    ids, cu = torch.cat(seqs), torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)
    lo, n = len(seqs[0]) + 3, len(seqs[1]) + 4  # from inside the second copy of a to inside b
    cut = []
    for dedup in (True, False):
        vis.dedup = dedup
        with torch.no_grad():
            cut.append(vis.slice_inputs(ids, cu, mms, lo, n, "cpu")["mm_encoder_outputs"]["image"].pooler_output[0])
    assert cut[0].shape[0] == int(vis.positions(ids, cu, mms)[1][lo:lo + n].sum()) > 0
    assert torch.allclose(cut[0], cut[1], atol=1e-6, rtol=0)


def test_images_that_differ_in_one_pixel_are_not_merged(vlm):
    from rlweave.backend_helpers.hf_model.vision_dedup import distinct

    path, vp = vlm
    _, a = vp.encode(f"{IMAGE}", [_img(16, 16, seed=3)])
    other = {k: v.clone() for k, v in a.items()}
    other["pixel_values"][2, 5] = torch.nextafter(other["pixel_values"][2, 5], torch.tensor(float("inf")))
    assert distinct([a, other], 2) is None
    merged = distinct([a, other, {k: v.clone() for k, v in a.items()}], 2)
    assert merged is not None and merged.grid.shape[0] == 2 and merged.index.numel() == 3 * merged.sizes[0]
    assert torch.equal(merged.index[2 * merged.sizes[0]:], merged.index[:merged.sizes[0]])  # the copy takes a's rows
    model, vis, rows = _tower_and_rows(path)
    with torch.no_grad():
        vis.features([a, other], "cpu")
    assert rows == [2 * int(a["pixel_values"].shape[0])]


def test_samples_sharing_images_share_their_device_copy():
    from rlweave.backend_helpers.training import on_device

    b = Batch.from_sequences([[1, 2], [3, 4], [5]])
    image = {"pixel_values": torch.ones(4, 2), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    b.set_mm([image, image, None])
    moved = on_device(b, torch.device("cpu"))
    assert moved.mm[0] is moved.mm[1] and moved.mm[0] is not image and moved.mm[2] is None
