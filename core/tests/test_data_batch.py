"""Packed Batch: packing, masks, selection, balanced partition, concat round trips."""

import itertools

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


def test_partition_keeps_groups_whole_when_counts_allow():
    """GRPO groups (and DPO pairs) stay on one part; counts stay equal; a group that fits
    nowhere whole is split, never dropped."""
    lens = [5, 9, 2, 7, 7, 3, 4, 8, 6, 1, 2, 9]
    b = Batch.from_sequences([[1] * n for n in lens])
    b.add_sample("group", torch.tensor([i // 3 for i in range(12)]))  # 4 groups of 3
    parts = b.balanced_partition(2)
    assert [len(p) for p in parts] == [6, 6]
    owner = {i: k for k, p in enumerate(parts) for i in p}
    for g in range(4):
        assert len({owner[i] for i in range(3 * g, 3 * g + 3)}) == 1, f"group {g} split"
    # 3 parts of 4: a group of 3 per part, then the fourth group is split one per part
    parts = b.balanced_partition(3)
    assert sorted(i for p in parts for i in p) == list(range(12))
    assert [len(p) for p in parts] == [4, 4, 4]
    owner = {i: k for k, p in enumerate(parts) for i in p}
    whole = [g for g in range(4) if len({owner[i] for i in range(3 * g, 3 * g + 3)}) == 1]
    assert len(whole) == 3
    # without a group field, samples are placed one by one (the earlier behaviour)
    b.sample.pop("group")
    assert [len(p) for p in b.balanced_partition(2)] == [6, 6]


def test_select_matches_sample_by_sample_slicing():
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 99, (int(n),), generator=g).tolist() for n in torch.randint(1, 9, (40,), generator=g)]
    b = Batch.from_sequences(seqs, prompt_lens=[max(1, len(s) // 2) for s in seqs])
    b.add_token("lp", torch.randn(b.num_tokens, 3, generator=g))
    for idx in ([], [5], [39, 0, 7, 7, 12], list(range(40))[::-1]):
        s = b.select(idx)
        for key in ("input_ids", "loss_mask", "lp"):
            expect = [b.token[key][b.cu_seqlens[i]:b.cu_seqlens[i + 1]] for i in idx]
            want = torch.cat(expect) if expect else b.token[key][:0]
            assert torch.equal(s.token[key], want), (key, idx)
        assert s.cu_seqlens.tolist() == [0] + list(itertools.accumulate(len(seqs[i]) for i in idx))


def test_loss_mask_covers_exactly_the_response_tokens():
    seqs = [[1] * n for n in (1, 2, 5, 3, 8)]
    plens = [1, 1, 4, 3, 2]
    b = Batch.from_sequences(seqs, prompt_lens=plens)
    want = [float(j >= p) for s, p in zip(seqs, plens) for j in range(len(s))]
    assert b.token["loss_mask"].tolist() == want


def test_shallow_copy_shares_tensors_not_fields():
    b = make()
    c = b.shallow_copy()
    c.add_token("w", torch.ones(b.num_tokens))
    c.add_sample("r", torch.zeros(len(b)))
    c.meta.append({"extra": 1})
    assert "w" not in b.token and "r" not in b.sample and len(b.meta) == 3
    assert c.token["input_ids"] is b.token["input_ids"] and c.ids == b.ids
    assert b.balanced_partition(1) == [[0, 1, 2]]
