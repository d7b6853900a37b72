"""examples/arith: the shipped data is reproducible and leak-free; the model builder writes a
tokenizer + Qwen2 that transformers reloads."""

import importlib.util
import json
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "arith"
DATA = EXAMPLE / "data"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"arith_{name}_e", EXAMPLE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(name):
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def test_shipped_data_is_what_make_data_writes(tmp_path):
    sizes = _load("make_data").make(tmp_path)
    for name, n in sizes.items():
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name
        assert len(_rows(name)) == n
    assert sum((DATA / name).stat().st_size for name in sizes) < 800_000  # small enough to ship in git


def test_no_held_out_prompt_in_any_train_file():
    test = {r["prompt"] for r in _rows("test.jsonl")}
    assert test == {r["prompt"] for r in _rows("pref_test.jsonl")}
    train = ({r["prompt"] for r in _rows("rl_train.jsonl")} | {r["query"] for r in _rows("sft_train.jsonl")}
             | {r["prompt"] for r in _rows("pref_train.jsonl")} | {r["query"] for r in _rows("rank_train.jsonl")})
    assert len(test) == 300 and not test & train
    assert {r["query"] for r in _rows("sft_train.jsonl")} < {r["prompt"] for r in _rows("rl_train.jsonl")}


def test_answers_and_preferences_are_right():
    for r in _rows("test.jsonl") + _rows("rl_train.jsonl"):
        assert r["answer"] == eval(r["prompt"].rstrip("="))  # noqa: S307 - our own "a+b" strings
    for r in _rows("pref_train.jsonl") + _rows("pref_test.jsonl"):
        truth = eval(r["prompt"].rstrip("="))  # noqa: S307
        assert r["chosen"] == str(truth) and r["rejected"] != r["chosen"]
    for r in _rows("rank_train.jsonl"):
        best = r["response"][r["score"].index(max(r["score"]))]
        assert best == str(eval(r["query"].rstrip("="))) and len(set(r["score"])) == 3  # noqa: S307


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("arith_model")
    return _load("build_model").build(out, DATA)


def test_model_and_tokenizer_reload(built):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built)
    ids = tok("12+7=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5 and tok.decode(ids) == "12+7="
    assert tok.unk_token_id not in tok("0123456789+-=", add_special_tokens=False)["input_ids"]
    assert tok.eos_token == "<eos>" and tok.pad_token == "<pad>" and tok.eos_token_id != tok.pad_token_id
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == "12+7="
    chat = tok.apply_chat_template([{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}],
                                   tokenize=False)
    assert chat == "1+1=2<eos>"

    model = AutoModelForCausalLM.from_pretrained(built)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tok)
    assert model.config.eos_token_id == tok.eos_token_id
    n = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < n < 3e6
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, 5, len(tok)) and torch.isfinite(logits).all()


def test_build_is_deterministic(built, tmp_path):
    again = _load("build_model").build(tmp_path / "again", DATA)
    assert (again / "model.safetensors").read_bytes() == (built / "model.safetensors").read_bytes()
    assert (again / "tokenizer.json").read_text() == (built / "tokenizer.json").read_text()
