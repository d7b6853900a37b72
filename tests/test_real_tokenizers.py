"""Real tokenizers and chat templates: what rlweave renders, encodes and generates equals what
transformers' own ``apply_chat_template`` and greedy ``generate`` give.

The tokenizer is SmolLM2's byte-level BPE (49,152 tokens, ``tests/data/smollm2_tokenizer``; see
its README), in two styles a tiny random model of its vocabulary is built with:

* **Qwen-style**: the tokenizer's own ChatML template (``<|im_start|>role\\n...<|im_end|>``, with
  a default system turn), EOS ``<|im_end|>``, and a ``generation_config.json`` naming two EOS ids
  (``<|im_end|>`` and ``<|endoftext|>``), as Qwen2.5-Instruct's does. No Qwen tokenizer is
  available offline; the template is the one shipped with SmolLM2, the same ChatML format;
* **Llama-style**: Llama 3's text split (pre-tokenizer regex) and special tokens added
  (``<|begin_of_text|>``, ``<|start_header_id|>``, ``<|end_header_id|>``, ``<|eot_id|>``,
  ``<|end_of_text|>``), its header/``<|eot_id|>`` template that writes the BOS itself, and its
  tokenizer's post-processor that *also* prepends the BOS when text is encoded with special
  tokens; EOS ``<|eot_id|>``, generation EOS ids ``<|end_of_text|>`` and ``<|eot_id|>``.

Each tiny model has one lm-head row swapped so that, greedily, one conversation ends on an EOS id
within a few tokens (for Qwen-style the ``<|endoftext|>`` that only ``generation_config.json``
names), so stopping is exercised, not just the length limit.

Checked per style: rlweave's data loader renders chat records (a last assistant turn dropped) to
``apply_chat_template(..., add_generation_prompt=True)``; the prompt ids rlweave sends to engines
equal ``apply_chat_template(..., tokenize=True)`` (one BOS, not two); the HF engine's and the
vLLM engine's greedy response ids, with the stop ids rlweave's rollout settings give, equal
``model.generate``'s (which ends on the first EOS id of the model's generation config), with
``finish_reason`` ``stop`` exactly where that ends on an EOS id. ``rlweave generate``'s prompts are
the same ids, and SFT trains on exactly the assistant turns' tokens (with their end-of-turn token).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

TOKENIZER = Path(__file__).resolve().parent / "data" / "smollm2_tokenizer"
ARCH = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
            max_position_embeddings=256, tie_word_embeddings=False)
MAX_NEW = 10
CHATS = [
    [{"role": "user", "content": "What is 2+3?"}],
    [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "And another one?"}],
    [{"role": "user", "content": "  Spaces, digits 12345 and ünïcödé  "}, {"role": "assistant", "content": "ok"}],
]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
#: how Llama 3's tokenizer splits text before its byte-level BPE (its tokenizer.json's pre-tokenizer)
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' "
    "+ m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@dataclass
class Style:
    """One tiny model with its tokenizer; ``expected[i]``: transformers' greedy response ids for
    ``CHATS[i]``; ``stopper``: the EOS id one of them ends on."""

    name: str
    model_dir: Path
    tokenizer: object
    expected: list[list[int]]
    stopper: int


def _asked(chat):
    return chat[:-1] if chat[-1]["role"] == "assistant" else chat


def _template_ids(tok, chat) -> list[int]:
    out = tok.apply_chat_template(_asked(chat), add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(out["input_ids"])


def _greedy(model_dir: Path, tok, chats) -> list[list[int]]:
    """transformers' greedy ``generate`` on each chat's template ids, with the model's own
    generation config (its EOS ids): the response ids, ending on an EOS id when it stopped."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for chat in chats:
        ids = torch.tensor([_template_ids(tok, chat)])
        with torch.no_grad():
            full = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
                                  do_sample=False)
        out.append(full[0, ids.shape[1]:].tolist())
    return out


def _swap_head_rows(model_dir: Path, a: int, b: int) -> None:
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    weights = load_file(str(path))
    head = weights["lm_head.weight"].clone()
    head[[a, b]] = head[[b, a]]
    weights["lm_head.weight"] = head
    save_file(weights, str(path), metadata={"format": "pt"})


def _build(root: Path, name: str, arch: str, tok, eos_ids: list[int], stopper: int) -> Style:
    """A tiny ``arch`` model of ``tok``'s vocabulary whose generation config names ``eos_ids``;
    the lm-head rows of ``stopper`` and of the third token greedy generation gives for
    ``CHATS[0]`` swapped, so that chat ends on ``stopper``."""
    from transformers import GenerationConfig

    from rlweave.testing.tiny_model import build_tiny

    model_dir = build_tiny(arch, ARCH, root / name, tokenizer=tok, seed=11)
    gc = GenerationConfig.from_pretrained(model_dir)
    gc.eos_token_id = eos_ids
    gc.save_pretrained(model_dir)
    third = _greedy(model_dir, tok, CHATS[:1])[0][2]
    assert third != stopper
    _swap_head_rows(model_dir, third, stopper)
    expected = _greedy(model_dir, tok, CHATS)
    assert expected[0][-1] == stopper and len(expected[0]) <= 3, expected[0]  # the stop is exercised
    return Style(name, model_dir, tok, expected, stopper)


@pytest.fixture(scope="module")
def styles(tmp_path_factory) -> dict[str, Style]:
    from tokenizers import Regex, pre_tokenizers, processors
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("real-tok")
    qwen_tok = AutoTokenizer.from_pretrained(TOKENIZER)
    qwen = _build(root, "qwen", "Qwen2", qwen_tok,
                  [qwen_tok.convert_tokens_to_ids("<|im_end|>"), qwen_tok.convert_tokens_to_ids("<|endoftext|>")],
                  stopper=qwen_tok.convert_tokens_to_ids("<|endoftext|>"))

    llama_tok = AutoTokenizer.from_pretrained(TOKENIZER)
    llama_tok.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS}, replace_extra_special_tokens=False)
    llama_tok.bos_token, llama_tok.eos_token, llama_tok.pad_token = "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>"
    bos = llama_tok.convert_tokens_to_ids("<|begin_of_text|>")
    llama_tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([  # Llama 3's split of the text
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    llama_tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    llama_tok.chat_template = LLAMA3_TEMPLATE
    assert llama_tok("hi")["input_ids"][0] == bos  # the tokenizer adds its BOS, as Llama 3's does
    eot = llama_tok.convert_tokens_to_ids("<|eot_id|>")
    llama = _build(root, "llama", "Llama", llama_tok, [llama_tok.convert_tokens_to_ids("<|end_of_text|>"), eot],
                   stopper=eot)
    llama.tokenizer = AutoTokenizer.from_pretrained(llama.model_dir)  # as saved with the model
    assert llama.tokenizer("hi")["input_ids"][0] == bos and llama.tokenizer.chat_template == LLAMA3_TEMPLATE
    pieces = llama.tokenizer.convert_ids_to_tokens(llama.tokenizer("\n\nBlue", add_special_tokens=False)["input_ids"])
    assert pieces[0] == "\u010a\u010a", pieces  # Llama 3's split kept: a blank line before a word is one token
    return {"qwen": qwen, "llama": llama}


def _records_file(tmp_path: Path) -> Path:
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"id": f"c{i}", "messages": m}) + "\n" for i, m in enumerate(CHATS)))
    return path


def _rlweave_prompts(style: Style, tmp_path: Path) -> tuple[list[str], list[list[int]]]:
    """Prompt texts and ids as a run makes them: the data loader renders the chat records,
    the rollout toolkit encodes them."""
    from rlweave.algo_helpers.rollout import encode_records
    from rlweave.data.records import load_records

    records = load_records(_records_file(tmp_path), tokenizer=style.tokenizer)
    ids, meta = encode_records(style.tokenizer, records)
    return [m["prompt"] for m in meta], ids


@pytest.mark.parametrize("name", ["qwen", "llama"])
def test_prompts_render_and_encode_as_transformers_does(styles, name, tmp_path):
    style = styles[name]
    tok = style.tokenizer
    texts, ids = _rlweave_prompts(style, tmp_path)
    for chat, text, got in zip(CHATS, texts, ids):
        assert text == tok.apply_chat_template(_asked(chat), tokenize=False, add_generation_prompt=True)
        assert got == _template_ids(tok, chat), (text, got[:4])
    # ``rlweave generate`` / ``eval`` make the same prompts
    from rlweave.commands.records import encode_records as command_ids
    from rlweave.commands.records import load_records as command_records
    from rlweave.commands.records import prompt_texts

    records = command_records(_records_file(tmp_path), tok)
    assert command_ids(tok, prompt_texts(records, tok), records, tmp_path) == ids
    if name == "llama":
        assert texts[0].startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n")
        assert sum(t == tok.bos_token_id for t in ids[0]) == 1  # the template's BOS only
    else:
        assert texts[0].startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
        assert texts[0].endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("name", ["qwen", "llama"])
def test_sft_trains_on_exactly_the_assistant_turns(styles, name):
    pytest.importorskip("rlweave_algo_sft", reason="rlweave-algo-sft not installed")
    from rlweave_algo_sft.data import encode_messages

    tok = styles[name].tokenizer
    chat = CHATS[1] + [{"role": "assistant", "content": "Red."}]
    ids, mask = encode_messages(tok, chat)
    assert ids == list(tok.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"])
    trained = tok.decode([t for t, m in zip(ids, mask) if m])
    assert trained == ("Blue.<|eot_id|>Red.<|eot_id|>" if name == "llama" else "Blue.<|im_end|>\nRed.<|im_end|>\n")


def _params(tok):
    from rlweave.algo_helpers.rollout import sampling_params

    cfg = SimpleNamespace(n_samples=1, temperature=0.0, top_p=1.0, top_k=-1, max_new_tokens=MAX_NEW)
    return sampling_params(cfg, tok, seed=0)


def _check_engine(style: Style, engine, tmp_path: Path) -> None:
    _, ids = _rlweave_prompts(style, tmp_path)
    gens = engine.generate(ids, _params(style.tokenizer))
    eos = set(json.loads((style.model_dir / "generation_config.json").read_text())["eos_token_id"])
    for i, (g,) in enumerate(gens):
        assert g.token_ids == style.expected[i], (style.name, i, g.token_ids, style.expected[i])
        stopped = bool(style.expected[i]) and style.expected[i][-1] in eos
        assert g.finish_reason == ("stop" if stopped else "length"), (i, g.finish_reason)
    assert gens[0][0].token_ids[-1] == style.stopper


@pytest.mark.parametrize("name", ["qwen", "llama"])
def test_hf_engine_generates_what_transformers_generates(styles, name, tmp_path):
    from rlweave.interfaces.worker import WorkerContext
    from rlweave_infer_hf.engine import HFEngine

    style = styles[name]
    engine = HFEngine(WorkerContext(role="rollout", options={}, model={"path": str(style.model_dir),
                                                                       "dtype": "float32"}, seed=1))
    engine.init_engine()
    try:
        _check_engine(style, engine, tmp_path)
    finally:
        engine.shutdown()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_vllm_engine_generates_what_transformers_generates(styles, tmp_path):
    from rlweave.interfaces.worker import WorkerContext
    from rlweave_infer_vllm.engine import VLLMEngine

    for name in ("qwen", "llama"):
        style = styles[name]
        engine = VLLMEngine(WorkerContext(role="rollout", options={"max_model_len": 256, "kv_cache_gib": 0.25},
                                          model={"path": str(style.model_dir), "dtype": "float32"}, seed=1))
        engine.init_engine()
        try:
            (tmp_path / name).mkdir()
            _check_engine(style, engine, tmp_path / name)
        finally:
            engine.shutdown()


def test_a_turn_ended_by_another_stop_token_gets_the_templates_end_of_message():
    """Multi-turn observations with the Qwen-style template: a model turn that stopped on the
    template's ``<|im_end|>`` continues after it; one that stopped on ``<|endoftext|>`` (a
    generation-config EOS the template never writes) gets the template's ``<|im_end|>`` first."""
    from transformers import AutoTokenizer

    from rlweave.algo_helpers.chat import observation_text

    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    msgs = [{"role": "user", "content": "ok"}]
    on_eos = observation_text(tok, msgs, stopped=True, stop_text="<|im_end|>")
    assert on_eos.startswith("\n<|im_start|>user\nok<|im_end|>")
    assert observation_text(tok, msgs, stopped=True, stop_text="<|endoftext|>") == "<|im_end|>" + on_eos
    assert observation_text(tok, msgs, stopped=True) == on_eos  # not told: the tokenizer's EOS
