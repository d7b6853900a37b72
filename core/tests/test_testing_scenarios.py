"""``rlweave.testing.scenarios``: the shared batches split over any number of ranks without loss
or overlap, weigh every loss token equally, a worker is looked up by backend name, and importing
the scenario and tiny-model helpers imports no torch, transformers, tokenizers or ray."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlweave.testing import scenarios as sc


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [6, 9])
def test_shard_indices_partition_the_batch(world, n):
    shards = [sc.shard_indices(world, r, n) for r in range(world)]
    assert sorted(i for s in shards for i in s) == list(range(n))
    if world > 1:
        assert shards[0] == [0]  # deliberately uneven


def test_batches_are_reproducible_and_token_weights_sum_to_one():
    pytest.importorskip("torch")
    import torch

    for make, n in ((sc.fixed_batch, 6), (sc.group_batch, 9)):
        a, b = make(), make()
        assert len(a) == n and torch.equal(a.token["input_ids"], b.token["input_ids"])
        assert float(a.token["token_weight"].sum()) == pytest.approx(1.0)
        assert bool((a.token["token_weight"][a.token["loss_mask"] == 0] == 0).all())
    assert not torch.equal(sc.fixed_batch(seed=4).token["input_ids"], sc.fixed_batch().token["input_ids"])


def test_an_unknown_backend_is_named_with_the_choices():
    from rlweave.plugins.errors import PluginError

    with pytest.raises(PluginError, match="nosuchbackend"):
        sc.train_worker("nosuchbackend", {"rank": 0, "world_size": 1, "master_port": 1, "device": "cpu"}, {})


def test_importing_the_helpers_stays_light():
    code = ("import sys, rlweave.testing.scenarios, rlweave.testing.ranks, rlweave.testing.helper_modules, "
            "rlweave.testing.tiny_model, rlweave.testing.tiny_tokenizer\n"
            "print(sorted(m for m in ('torch', 'transformers', 'tokenizers', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
