"""bench/decode_cost.py's model: the line through a decode step's cost by batch size, and the
generation time of a sync step and of a partial round it gives for a set of response lengths."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_decode_cost_t", ROOT / "bench" / "decode_cost.py")
decode_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(decode_cost)


def test_the_fit_recovers_the_per_step_and_per_sequence_costs():
    a, b = decode_cost.fit({bsz: 0.002 + 5e-5 * bsz for bsz in (1, 4, 16, 64)})
    assert a == pytest.approx(0.002)
    assert b == pytest.approx(5e-5)


def test_a_sync_step_pays_a_decode_step_per_token_of_its_longest_sample():
    # one group of two samples of 10 tokens and one of two of 100: 100 decode steps, 220 tokens
    lengths = [10, 100]
    sync, partial, tokens = decode_cost.generation_seconds(1.0, 0.0, lengths, groups=2, samples=2, budget=48,
                                                           draws=3)
    assert tokens == 220
    assert sync == pytest.approx(100.0)
    assert partial == pytest.approx(48.0)  # the round is cut at the budget


def test_partial_rollout_gains_nothing_when_a_decode_step_costs_only_its_sequences():
    lengths = [3, 7, 20, 150, 256]
    sync, partial, tokens = decode_cost.generation_seconds(0.0, 1e-3, lengths, groups=3, samples=4, budget=48,
                                                           draws=20)
    assert sync == pytest.approx(partial)
    assert sync == pytest.approx(tokens * 1e-3)
    sync, partial, _ = decode_cost.generation_seconds(1e-3, 1e-3, lengths, groups=3, samples=4, budget=48, draws=20)
    assert partial < sync
