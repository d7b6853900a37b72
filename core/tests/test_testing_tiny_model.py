"""``rlweave.testing.tiny_model`` with a tokenizer of ``rlweave.testing.tiny_tokenizer`` (what the
examples build): the model takes the tokenizer's vocabulary and special ids, the directory holds
both, and the same arguments give the same files."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")


def test_a_tiny_model_with_a_char_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave.testing.tiny_tokenizer import SPECIALS, char_tokenizer, task_texts

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rl_train.jsonl").write_text(json.dumps({"prompt": "ab=", "answer": 12}) + "\n")
    tok = char_tokenizer(task_texts(tmp_path / "data", "xy"), max_length=64)
    assert len(tok) == len(SPECIALS) + len(set("xyab=12"))
    out = [build_tiny_qwen2(tmp_path / name, None, 16, 1, 2, 1, 32, seed=5, init_std=None, tokenizer=tok)
           for name in ("a", "b")]
    cfg = json.loads((out[0] / "config.json").read_text())
    assert cfg["vocab_size"] == len(tok) and cfg["eos_token_id"] == tok.eos_token_id != cfg["pad_token_id"]
    assert json.loads((out[0] / "generation_config.json").read_text())["eos_token_id"] == tok.eos_token_id
    again = AutoTokenizer.from_pretrained(out[0])
    assert again.decode(again("ab=12", add_special_tokens=False)["input_ids"]) == "ab=12"
    assert (out[0] / "model.safetensors").read_bytes() == (out[1] / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="tokenizer has"):
        build_tiny_qwen2(tmp_path / "c", len(tok) + 1, 16, 1, 2, 1, 32, tokenizer=tok)
