"""Image checks of ``load_config`` (:mod:`rlweave.config.vision_inputs`): on a tiny random
Qwen2-VL, every bad image record of the data head is reported by file, line or row, and field
(an unreadable or missing image, a placeholder count that differs from the image count, a prompt
too long once its image tokens are expanded); a text-only model refuses image records;
``model.vision`` reaches the processor and is checked itself."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config

_FAKES = Path(__file__).parent / "plugin_dists" / "fakes.py"
_spec = importlib.util.spec_from_file_location("rlweave_test_fakes", _FAKES)
fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 ?.,:+="
#: what the chat template writes for one image part
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def vlm(tmp_path_factory) -> Path:
    """A tiny random Qwen2-VL directory (images of 16x16 to 32x32 pixels: 4 to 16 tokens)."""
    from rlweave.testing.tiny_vlm import build_tiny_qwen2_vl, vision_tokenizer

    return build_tiny_qwen2_vl(tmp_path_factory.mktemp("vlm") / "model", vision_tokenizer([CHARS]))


def png(h: int, w: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 200, dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch, tmp_path, vlm):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", "hf-cache")
    Path("model").symlink_to(vlm)
    Path("img").mkdir()
    Path("img/small.png").write_bytes(png(16, 16))
    Path("img/big.png").write_bytes(png(32, 32))
    Path("img/broken.png").write_bytes(b"GIF89a but not really")
    Path("text_model").mkdir()
    Path("text_model/config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 64}))
    Path("text_model/chat_template.jinja").write_text("{{ messages }}")


def jsonl(name: str, *rows) -> str:
    Path(name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return name


class EngineOptions(fakes._Strict):
    max_model_len: int | None = None


def make_pm():
    """The fake plugins plus a backend ``train`` and an engine ``gen`` (options: ``max_model_len``)
    that take vision-language models."""
    from rlweave.plugins import BackendRecord, EngineRecord

    pm = fakes.make_pm()
    pm.register(fakes.plugin(rlweave_training_backends=lambda: [BackendRecord("train", "trains", "x:y", vision=True)],
                             rlweave_inference_engines=lambda: [EngineRecord("gen", "generates", "x:y", EngineOptions,
                                                                             vision=True)]),
                name="vlm", distribution="rlweave-vlm", version="0.1.0")
    return pm


def config(max_model_len: int | None = None, **changes):
    options = {"max_model_len": max_model_len} if max_model_len else {}
    data = {"resources": {"pools": {"default": {"devices_per_node": 2}}},
            "model": {"path": "model"},
            "roles": {"policy": {"backend": "train"}, "rollout": {"engine": "gen", "options": options}},
            "algorithm": {"name": "grpo"}, "data": {"train": "train.jsonl"}}
    data.update(changes)
    return data


def errors(data) -> list[str]:
    Path("c.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError) as err:
        load_config("c.yaml", pm=make_pm())
    return [str(i) for i in err.value.issues]


def valid(data):
    Path("c.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config("c.yaml", pm=make_pm())


def chat(*parts, images=None) -> dict:
    rec = {"messages": [{"role": "user", "content": list(parts)}]}
    return rec if images is None else {**rec, "images": images}


def test_good_image_records_of_both_forms_validate_and_the_bounds_reach_the_config():
    jsonl("train.jsonl", {"prompt": f"{IMAGE}what?", "images": "img/small.png"},
          chat({"type": "image"}, {"type": "text", "text": "and?"}, {"type": "image", "image": "img/big.png"},
               images=["img/small.png"]),
          {"prompt": "1+1=", "answer": 2})
    cfg, _ = valid(config(model={"path": "model", "vision": {"min_pixels": 256, "max_pixels": 1024}}))
    assert cfg.model.vision.model_dump() == {"min_pixels": 256, "max_pixels": 1024}
    from rlweave.scheduler.contexts import worker_context

    ctx = worker_context(cfg, "rollout", 0, ("127.0.0.1", 1))
    assert ctx.model["vision"] == {"min_pixels": 256, "max_pixels": 1024}


def test_every_bad_image_record_is_named_by_file_line_and_field():
    jsonl("train.jsonl",
          {"prompt": f"{IMAGE}ok", "images": ["img/small.png"]},
          {"prompt": f"{IMAGE}a", "images": ["img/broken.png"]},
          {"prompt": f"{IMAGE}b", "images": ["img/small.png", "img/small.png"]},
          {"query": "c", "images": "img/small.png"},
          {"prompt": f"{IMAGE}{IMAGE}d"},
          chat({"type": "text", "text": "e"}, {"type": "image"}, images=["img/small.png"]))
    lines = errors(config(data={"train": "train.jsonl",
                                "chat_template": "{% for p in messages[0]['content'] %}{{ p.get('text', '') }}"
                                                 "{% endfor %}"}))
    head = "c.yaml: data.train: train.jsonl"
    assert lines[0].startswith(f"{head} line 2: field 'images': image 0: cannot decode the image (cannot identify ")
    assert lines[1:] == [
        f"{head} line 3: field 'prompt': 1 image placeholder(s) (<|image_pad|>) but 2 image(s) in 'images': the text "
        "needs one placeholder where each image goes",
        f"{head} line 4: field 'query': 0 image placeholder(s) (<|image_pad|>) but 1 image(s) in 'images': the text "
        "needs one placeholder where each image goes",
        f"{head} line 5: field 'prompt': 2 image placeholder(s) (<|image_pad|>) but no 'images': the text needs one "
        "placeholder where each image goes",
        f"{head} line 6: field 'messages': the chat template renders 0 image placeholder(s) (<|image_pad|>) but the "
        "record has 1 image(s): give each image its {\"type\": \"image\"} part, and use a chat template that renders "
        "image parts"]


def test_a_missing_image_is_named_by_the_loader(tmp_path):
    jsonl("train.jsonl", {"prompt": f"{IMAGE}ok", "images": ["img/small.png"]},
          chat({"type": "image", "image": "img/gone.png"}))
    assert errors(config()) == [
        f"c.yaml: data.train: train.jsonl line 2: field 'messages': image 0: image file '{tmp_path}/img/gone.png' "
        "does not exist ('img/gone.png' is taken from the data file's folder)"]


def test_a_prompt_too_long_after_its_image_tokens_are_expanded():
    # 32x32 -> 16 image tokens (+ 2 vision tokens + 2 characters): 20 tokens, no room left in 20
    jsonl("train.jsonl", chat({"type": "image", "image": "img/big.png"}, {"type": "text", "text": "hi"}),
          {"prompt": "short text, no image"})
    assert errors(config(max_model_len=20)) == [
        "c.yaml: data.train: train.jsonl line 1: field 'messages': the prompt is 20 tokens with its 1 image(s) "
        "expanded, not fewer than roles.rollout.options.max_model_len (20), which leaves no room for a response: "
        "lower model.vision.max_pixels, use fewer or smaller images or a shorter text, or raise the limit"]
    # the run's pixel bounds are the ones measured: at most 16x16 pixels, the image is 4 tokens
    assert valid(config(max_model_len=20, model={"path": "model", "vision": {"max_pixels": 256}}))
    assert valid(config(max_model_len=21))


def test_the_prompt_limit_is_the_algorithms_max_length_else_the_engines_max_model_len():
    from rlweave.config.resolve import ResolvedPlugins
    from rlweave.config.schema import RunConfig
    from rlweave.config.vision_inputs import prompt_limit

    class Sft:
        max_length = 12

    cfg = RunConfig.model_validate(config())
    assert prompt_limit(cfg, ResolvedPlugins(algorithm_config=Sft()), "model") == (12, "algorithm.max_length (12)")
    assert prompt_limit(cfg, ResolvedPlugins(), "model") == (
        1024, "the engine's max_model_len (1024: the model's max_position_embeddings; "
        "roles.rollout.options.max_model_len unset)")
    assert prompt_limit(RunConfig.model_validate(config(max_model_len=99)), ResolvedPlugins(), "model") == (
        99, "roles.rollout.options.max_model_len (99)")
    assert prompt_limit(cfg, ResolvedPlugins(), "img")[0] == 2048  # no config.json: the engines' default


def test_a_text_only_model_refuses_image_records():
    jsonl("train.jsonl", {"prompt": "1+1=", "answer": 2}, {"prompt": f"{IMAGE}?", "images": ["img/small.png"]},
          chat({"type": "image", "image": "img/small.png"}, {"type": "image", "image": "img/big.png"}))
    tail = "is not a vision-language model (its config.json has no vision_config): use a vision-language model, or " \
           "leave the images out"
    assert errors(config(model={"path": "text_model"})) == [
        f"c.yaml: data.train: train.jsonl line 2: field 'images': the record has 1 image(s) but the model "
        f"(text_model) {tail}",
        f"c.yaml: data.train: train.jsonl line 3: field 'messages': the record has 2 image(s) but the model "
        f"(text_model) {tail}"]
    jsonl("train.jsonl", {"prompt": "1+1=", "answer": 2})
    assert valid(config(model={"path": "text_model"}))
    assert errors(config(model={"path": "text_model", "vision": {"max_pixels": 256}})) == [
        "c.yaml: model.vision: image size bounds for a model (text_model) that is not a vision-language model (its "
        "config.json has no vision_config): remove them"]


def test_pixel_bounds_are_checked_and_shared_by_the_roles_running_the_policy():
    jsonl("train.jsonl", {"prompt": "1+1=", "answer": 2})
    assert errors(config(model={"path": "model", "vision": {"min_pixels": 1024, "max_pixels": 256, "max": 1}})) == [
        "c.yaml: model.vision.max_pixels: must be at least min_pixels (1024), got 256",
        "c.yaml: model.vision.max: unknown key (allowed: min_pixels, max_pixels)"]
    roles = {"policy": {"backend": "train", "model": {"path": "model", "vision": {"max_pixels": 512}}},
             "rollout": {"engine": "gen", "model": {"path": "model"}}}
    assert errors(config(roles=roles)) == [
        "c.yaml: roles.rollout.model.vision: None differs from roles.policy.model.vision ({'min_pixels': None, "
        "'max_pixels': 512}): the rollout role must resize images as the policy does, or their image token counts "
        "differ; set it equal, or leave it out of both and set model.vision"]


def test_what_does_not_take_a_vision_model_is_refused_by_key():
    jsonl("train.jsonl", {"prompt": f"{IMAGE}?", "images": ["img/small.png"], "answer": 1})
    roles = {"policy": {"backend": "megatron"}, "rollout": {"engine": "vllm"}}
    found = errors(config(roles=roles))
    assert any(e.startswith("c.yaml: roles.policy.backend: model model is a vision-language model, which backend "
                            "'megatron' does not take") for e in found), found
    assert any(e.startswith("c.yaml: roles.rollout.engine: model model is a vision-language model, which engine "
                            "'vllm' does not take") for e in found), found
    found = errors(config(roles={"policy": {"backend": "train", "parallel": {"sp": 2}, "devices": 2},
                                 "rollout": {"engine": "gen"}},
                          rollout={"partial": {"token_budget_per_step": 4}}))
    assert any(e.startswith("c.yaml: rollout.partial: partial rollout does not carry images") for e in found)
