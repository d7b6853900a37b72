"""The sharded optimizer's plan (:func:`rlweave_backend_megatron.zero.owners`): every name gets
one owner, pinned names keep theirs, the rest balance the elements per rank, and the plan depends
on names and sizes alone (every rank computes the same). The sharded step itself runs in the
dp=2 tests of ``test_megatron_cpu.py``."""

from __future__ import annotations

from rlweave_backend_megatron.zero import owners


def test_owners_balance_and_keep_pinned_names():
    sizes = {"emb": 1000, "a": 400, "b": 300, "c": 300, "d": 10, "e": 10}
    plan = owners(sizes, 2, {"emb": 0, "not-here": 1})
    assert set(plan) == set(sizes) and plan["emb"] == 0
    load = [sum(n for k, n in sizes.items() if plan[k] == r) for r in range(2)]
    assert load == [1010, 1010]  # a, b, c on rank 1 (rank 0 holds the pinned 1000), then d to the tie's lower rank
    assert [plan[k] for k in "abcde"] == [1, 1, 1, 0, 1]
    assert owners(dict(reversed(list(sizes.items()))), 2, {"emb": 0}) == plan  # order of the dict does not matter


def test_owners_spread_equal_sizes_round_robin():
    plan = owners({f"w{i}": 8 for i in range(6)}, 3)
    assert sorted(plan.values()) == [0, 0, 1, 1, 2, 2]
