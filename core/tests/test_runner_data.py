"""JsonlDataset ids and errors; DataIterator determinism and resume."""

import json

import pytest

from rlweave.data.records import JsonlDataset
from rlweave.runner.data import DataIterator


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_ids_and_required(tmp_path):
    p = _write(tmp_path / "train.jsonl", [{"prompt": "a"}, "", {"prompt": "b", "id": 7}, {"prompt": "c"}])
    ds = JsonlDataset(p, required=["prompt"])
    assert [r["id"] for r in ds] == ["train:1", "7", "train:4"]
    assert len(ds) == 3 and ds[1]["prompt"] == "b" and ds.head(2) == ds.records[:2]
    with pytest.raises(ValueError, match=r"train.jsonl line 1: missing field 'answer' \(has \['prompt'\]\)"):
        JsonlDataset(p, required=["prompt", "answer"])


@pytest.mark.parametrize(
    "rows,match",
    [
        ([{"a": 1}, '{"a": 2'], r"bad.jsonl line 2: invalid JSON"),
        ([{"a": 1}, "[1, 2]"], r"bad.jsonl line 2: expected a JSON object"),
        ([{"id": "x"}, {"id": "x"}], r"bad.jsonl line 2: duplicate id 'x' \(first at line 1\)"),
        ([""], r"no records"),
    ],
)
def test_errors_name_file_and_line(tmp_path, rows, match):
    with pytest.raises(ValueError, match=match):
        JsonlDataset(_write(tmp_path / "bad.jsonl", rows))
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        JsonlDataset(tmp_path / "missing.jsonl")


def _ds(n=10):
    return [{"id": str(i)} for i in range(n)]


def _ids(batch):
    return [r["id"] for r in batch]


def test_epochs_cover_everything_and_reshuffle():
    it = DataIterator(_ds(10), batch_size=5, seed=3)
    e0 = _ids(it.next_batch()) + _ids(it.next_batch())
    e1 = _ids(it.next_batch()) + _ids(it.next_batch())
    assert sorted(e0) == sorted(e1) == sorted(str(i) for i in range(10))
    assert e0 != e1 and it.epoch == 1
    assert _ids(DataIterator(_ds(10), 5, seed=3).next_batch()) == e0[:5]  # seeded
    assert _ids(DataIterator(_ds(10), 5, seed=4).next_batch()) != e0[:5]
    assert _ids(DataIterator(_ds(10), 4, shuffle=False).next_batch()) == ["0", "1", "2", "3"]


def test_resume_gives_same_batches():
    a = DataIterator(_ds(7), batch_size=3, seed=11)  # batches cross epoch boundaries
    for _ in range(4):
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))
    expected = [_ids(a.next_batch()) for _ in range(6)]
    b = DataIterator(_ds(7), batch_size=3, seed=11)
    b.load_state_dict(state)
    assert [_ids(b.next_batch()) for _ in range(6)] == expected
    c = DataIterator(_ds(8), batch_size=3, seed=11)
    with pytest.raises(ValueError, match="size was 7"):
        c.load_state_dict(state)


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        DataIterator(_ds(3), 0)
    with pytest.raises(ValueError, match="empty"):
        DataIterator([], 2)
