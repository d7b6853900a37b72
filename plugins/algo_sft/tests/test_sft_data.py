"""SFT record encoding with a real (locally built) tokenizer: masks cover responses only,
EOS appended, chat templates respected."""

import pytest

from rlweave_algo_sft.data import encode_record

CHARS = list("0123456789+-*= abcdefghijklmnopqrstuvwxyz:?\n<>|/")


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "<pad>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    for t in ("<|user|>", "<|assistant|>", "<|end|>"):
        vocab[t] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    t = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>")
    t.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>", "<|end|>"]})
    return t


def test_query_response_mask_and_eos(tok):
    ids, mask = encode_record(tok, {"query": "1+2=", "response": "3"})
    assert tok.decode(ids) == "1+2=3<eos>"
    assert mask == [0, 0, 0, 0, 1, 1]
    ids2, mask2 = encode_record(tok, {"query": "1+2=", "response": "3"}, append_eos=False)
    assert ids2 == ids[:-1] and mask2 == mask[:-1]


def test_chat_without_template_trains_every_assistant_turn(tok):
    rec = {"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "no"},
    ]}
    ids, mask = encode_record(tok, rec)
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == "yo<eos>\nno<eos>\n"


def test_chat_with_template(tok):
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    try:
        rec = {"messages": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]}
        ids, mask = encode_record(tok, rec)
        assert tok.decode(ids) == "<|user|>2+2=<|end|><|assistant|>4<|end|>"
        assert tok.decode([i for i, m in zip(ids, mask) if m]) == "4<|end|>"
    finally:
        tok.chat_template = None


def test_bad_records_name_the_record(tok):
    with pytest.raises(ValueError, match="record 9"):
        encode_record(tok, {"id": 9, "text": "x"})
    with pytest.raises(ValueError, match="record 3: chat record has no assistant"):
        encode_record(tok, {"id": 3, "messages": [{"role": "user", "content": "x"}]})
