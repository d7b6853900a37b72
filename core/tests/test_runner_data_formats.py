"""Data files in jsonl, parquet and datasets' save_to_disk directories; chat records rendered
with a chat template; one error line per malformed record naming file, record and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlweave.data.records import DataError, RecordDataset, load_records
from rlweave.runner.data import DataIterator, open_data

ROWS = [{"prompt": "1+1=", "answer": 2, "id": None}, {"prompt": "2+3=", "answer": 5, "id": "own"},
        {"prompt": "4+4=", "answer": 8, "id": None}]  # a table's columns: every row has every key
CHAT = [{"messages": [{"role": "user", "content": "1+1="}], "answer": 2},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+3="},
                      {"role": "assistant", "content": "5"}], "answer": 5}]
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def save_dataset(path: Path, rows) -> Path:
    import datasets

    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def tiny_tokenizer(tmp_path: Path):
    """A character-level tokenizer trained here, without a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.train_from_iterator(["0123456789+-=<>/abcdefghijklmnopqrstuvwxyz "],
                            trainers.BpeTrainer(vocab_size=64, special_tokens=["<unk>", "<eos>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.save_pretrained(str(tmp_path / "tok"))
    return AutoTokenizer.from_pretrained(str(tmp_path / "tok"))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf_disk"])
def test_every_format_gives_the_same_records_with_stable_ids(tmp_path, fmt):
    writer = {"jsonl": (write_jsonl, "train.jsonl"), "parquet": (write_parquet, "train.parquet"),
              "hf_disk": (save_dataset, "train")}[fmt]
    path = writer[0](tmp_path / writer[1], ROWS)
    ds = RecordDataset(path, required=["answer"])
    first = {"jsonl": "train:1", "parquet": "train:0", "hf_disk": "train:0"}[fmt]
    last = {"jsonl": "train:3", "parquet": "train:2", "hf_disk": "train:2"}[fmt]
    assert [r["id"] for r in ds] == [first, "own", last]
    assert [(r["prompt"], r["answer"]) for r in ds] == [(r["prompt"], r["answer"]) for r in ROWS]
    it = DataIterator(ds, batch_size=2, seed=1)
    assert sorted(r["id"] for r in it.next_batch() + it.next_batch()[:1]) == sorted([first, "own", last])


def test_parquet_without_suffix_and_saved_dataset_dicts(tmp_path):
    path = write_parquet(tmp_path / "data.bin", ROWS)
    assert [r["answer"] for r in load_records(path)] == [2, 5, 8]
    import datasets

    datasets.DatasetDict(train=datasets.Dataset.from_list(ROWS), test=datasets.Dataset.from_list(ROWS[:1])).save_to_disk(
        str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"dd holds a DatasetDict with splits train, test: point at one split's "
                                        r"directory, e.g. .*dd/train$"):
        load_records(tmp_path / "dd")
    assert [r["id"] for r in load_records(tmp_path / "dd" / "test")] == ["test:0"]
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match="not a dataset saved with datasets' save_to_disk"):
        load_records(tmp_path / "plain")


TEXT = ("prompt", "query", "messages", "chosen")
GOOD = {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}


@pytest.mark.parametrize("bad,message", [
    ({"messages": [{"role": "user"}]}, "field 'messages': message 0 has no 'content'"),
    ({"messages": "hello"}, "field 'messages': expected a list of {role, content} messages, got str"),
    ({"messages": [{"role": "user", "content": 3}]}, "field 'messages': message 0: 'content' must be a string, got int"),
    ({"messages": [["user", "hi"]]}, "field 'messages': message 0 is a list, not a {role, content} object"),
    ({"prompt": 7}, "field 'prompt': expected a string or a message list, got int"),
    ({"answer": 3}, "none of the fields prompt, query, messages, chosen (has ['answer'])"),
    ('{"prompt": "x"', "invalid JSON: Expecting ',' delimiter (column 1)"),
    ("[1]", "expected a JSON object, got list"),
], ids=["no-content", "not-a-list", "int-content", "list-message", "int-prompt", "no-text", "json", "array"])
def test_a_malformed_jsonl_record_is_one_line_naming_file_line_and_field(tmp_path, bad, message):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, "", GOOD, bad])
    with pytest.raises(DataError) as err:
        load_records(path, require_any=TEXT)
    assert str(err.value) == f"{path} line 4: {message}"


@pytest.mark.parametrize("bad,message", [
    ({"messages": [{"role": "user", "content": None}]}, "field 'messages': message 0 has no 'content'"),
    ({"messages": None, "prompt": None}, "none of the fields prompt, query, messages, chosen (has ['id'])"),
], ids=["null-content", "null-text"])
def test_a_malformed_table_row_is_one_line_naming_file_row_and_field(tmp_path, bad, message):
    rows = [{**GOOD, "id": "a"}, {**GOOD, "id": "b"}, {**GOOD, **bad, "id": "c"}]
    for path in (write_parquet(tmp_path / "d.parquet", rows), save_dataset(tmp_path / "saved", rows)):
        with pytest.raises(DataError) as err:
            load_records(path, require_any=TEXT)
        assert str(err.value) == f"{path} row 2: {message}".replace("['id']", "['id']")
    with pytest.raises(DataError, match=r"d2.parquet row 1: duplicate id 'a' \(first at row 0\)"):
        load_records(write_parquet(tmp_path / "d2.parquet", [{**GOOD, "id": "a"}, {**GOOD, "id": "a"}]))


def test_chat_records_are_rendered_with_the_chat_template(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    path = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    assert not tok.chat_template
    with pytest.raises(DataError) as err:
        load_records(path, tokenizer=tok)
    assert str(err.value) == (f"{path} line 1: field 'messages': the tokenizer ({tmp_path / 'tok'}) has no chat "
                              "template to render chat messages with: set data.chat_template (a Jinja template, or a "
                              ".jinja file) or use a tokenizer that has one")

    tok.chat_template = TEMPLATE
    recs = load_records(path, tokenizer=tok)
    assert recs[0]["prompt"] == "<user>1+1=</user><assistant>"
    # the last assistant turn is the answer, not part of the prompt; the conversation itself stays
    assert recs[1]["prompt"] == "<system>be brief</system><user>2+3=</user><assistant>"
    assert recs[1]["messages"] == CHAT[1]["messages"]
    assert load_records(path)[0].get("prompt") is None  # without a tokenizer nothing is rendered

    (tmp_path / "t.jinja").write_text(TEMPLATE.replace("<assistant>", "A:"))
    tok.chat_template = None
    data = type("Data", (), {"train": str(path), "eval": None, "chat_template": str(tmp_path / "t.jinja")})()
    train, evals = open_data(data, tok)
    assert evals is None and train[0]["prompt"] == "<user>1+1=</user>A:"
    assert tok.chat_template == TEMPLATE.replace("<assistant>", "A:")  # the algorithms and hf/ see the same one


def test_prompts_given_as_messages_and_preference_records(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    tok.chat_template = TEMPLATE
    rows = [{"prompt": [{"role": "user", "content": "1+1="}], "answer": 2, "chosen": None, "rejected": None},
            {"prompt": [{"role": "user", "content": "2+2="}], "answer": None,
             "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}]}]
    recs = load_records(write_parquet(tmp_path / "p.parquet", rows), tokenizer=tok)
    assert recs[0]["prompt"] == "<user>1+1=</user><assistant>"
    assert recs[1]["prompt"] == rows[1]["prompt"]  # preference records are rendered by the algorithm
    with pytest.raises(DataError, match=r"p2.parquet row 0: field 'chosen': message 0 has no 'role'"):
        load_records(write_parquet(tmp_path / "p2.parquet", [{"prompt": "x", "chosen": [{"content": "4"}],
                                                              "rejected": "5"}]))
