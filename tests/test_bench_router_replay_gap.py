"""bench/router_replay_gap.py on a tiny random Qwen3-MoE: with the engine in the trainer's dtype
there is no gap and no routing to change; in bf16 the table has every column."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlweave.testing.helper_modules import import_helper

gap = import_helper(Path(__file__).resolve().parents[1] / "bench" / "router_replay_gap.py")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return gap.build("random:2x8x2", str(tmp_path_factory.mktemp("gap")))


def test_an_engine_in_the_trainers_dtype_has_no_gap_and_changes_no_routing(model):
    r = gap.measure(model, gap.prompts(model, 3, gap.DATA, 1), "float32", 4, 1)
    assert r["decisions_changed"] == 0.0 and r["tokens_changed"] == 0.0
    assert r["none"]["max"] == 0.0 and r["r3"]["max"] == 0.0


def test_a_bf16_engine_gives_a_gap_and_a_full_table_row(model):
    r = gap.measure(model, gap.prompts(model, 3, gap.DATA, 1), "bfloat16", 4, 1)
    assert r["tokens"] > 0 and r["none"]["mean"] > 0.0
    assert 0.0 <= r["decisions_changed"] <= 1.0
    lines = gap.table([{**r, "label": "random:2x8x2"}]).splitlines()
    assert len({len(re.findall(r"(?<!\\)\|", line)) for line in lines}) == 1  # every row has every column
    with pytest.raises(SystemExit, match="random:LxExK"):
        gap.build("random:2x8", "/nonexistent")
