"""Packed Batch: packing, masks, selection, balanced partition, concat round trips."""

import pytest
import torch

from rlweave.data.batch import Batch


def make():
    return Batch.from_sequences(
        [[1, 2, 3, 4], [5, 6], [7, 8, 9]], ids=["a", "b", "c"], meta=[{"k": 0}, {"k": 1}, {"k": 2}], prompt_lens=[2, 1, 3]
    )


def test_packing_offsets_and_masks():
    b = make()
    assert len(b) == 3 and b.num_tokens == 9
    assert b.cu_seqlens.tolist() == [0, 4, 6, 9]
    # prompt tokens are never trained; response tokens are
    assert b.token["loss_mask"].tolist() == [0, 0, 1, 1, 0, 1, 0, 0, 0]
    assert b.position_ids().tolist() == [0, 1, 2, 3, 0, 1, 0, 1, 2]
    assert b.sample_index().tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 2]


def test_select_reorders_everything_consistently():
    b = make()
    b.add_sample("reward", torch.tensor([0.1, 0.2, 0.3]))
    s = b.select([2, 0])
    assert s.ids == ["c", "a"] and s.meta == [{"k": 2}, {"k": 0}]
    assert s.token["input_ids"].tolist() == [7, 8, 9, 1, 2, 3, 4]
    assert s.sample["reward"].tolist() == pytest.approx([0.3, 0.1])
    assert s.cu_seqlens.tolist() == [0, 3, 7]


def test_partition_then_concat_restores_order():
    seqs = [[i] * n for i, n in enumerate([5, 1, 9, 3, 3, 7, 2], start=1)]
    b = Batch.from_sequences(seqs)
    parts = b.balanced_partition(3)
    assert sorted(i for p in parts for i in p) == list(range(7))
    assert [len(p) for p in parts] == [3, 2, 2]
    loads = [int(b.seqlens[p].sum()) for p in parts]
    assert max(loads) - min(loads) <= 9  # never worse than one longest sequence
    order = [i for p in parts for i in p]
    back = Batch.concat([b.select(p) for p in parts]).select(torch.argsort(torch.tensor(order)))
    assert torch.equal(back.token["input_ids"], b.token["input_ids"]) and back.ids == b.ids


def test_bad_fields_are_rejected():
    b = make()
    with pytest.raises(ValueError, match="token field 'x' has 2 rows"):
        b.add_token("x", torch.zeros(2))
    with pytest.raises(ValueError, match="prompt_len"):
        Batch.from_sequences([[1, 2]], prompt_lens=[3])
    with pytest.raises(ValueError, match="different fields"):
        Batch.concat([make(), Batch.from_sequences([[1, 2]])])
