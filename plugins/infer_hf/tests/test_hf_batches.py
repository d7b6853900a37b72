"""How the transformers engine cuts a call's samples into forward batches
(``max_batch_size`` rows and ``max_batch_tokens`` of padded batch at most)."""

from __future__ import annotations

import pytest

from rlweave.interfaces.engine import SamplingParams
from rlweave.interfaces.worker import WorkerContext
from rlweave_infer_hf.engine import HFEngine, micro_batches


def test_micro_batches_keep_rows_and_padded_tokens_under_their_limits():
    assert micro_batches([12] * 256, 256, 16384) == [(0, 256)]  # a small model's whole step: one batch
    assert micro_batches([12] * 300, 256, 16384) == [(0, 256), (256, 300)]  # rows bind
    # tokens bind: rows x the longest length so far (prompts come sorted by length)
    assert micro_batches([10, 20, 30, 40], 4, 60) == [(0, 2), (2, 3), (3, 4)]
    assert micro_batches([100, 5], 4, 50) == [(0, 1), (1, 2)]  # too long alone: a batch of its own
    assert micro_batches([], 4, 50) == []


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from rlweave.testing.tiny_model import build_tiny_qwen2

    path = build_tiny_qwen2(tmp_path_factory.mktemp("hf_batches"))
    e = HFEngine(WorkerContext(role="rollout", options={"max_model_len": 64}, model={"path": str(path)}, seed=3))
    e.init_engine()
    yield e
    e.shutdown()


@pytest.mark.parametrize("options, rows", [({}, [24]),  # the defaults: one batch for the whole call
                                           ({"max_batch_size": 10}, [10, 10, 4]),
                                           ({"max_batch_tokens": 8 * 9}, [8, 8, 8])])  # 8 rows of 3 + 6 tokens
def test_a_call_runs_one_generate_per_planned_batch(engine, options, rows, monkeypatch):
    seen: list[int] = []
    inner = engine.model.generate

    def counting(**kw):
        seen.append(kw["input_ids"].shape[0])
        return inner(**kw)

    monkeypatch.setattr(engine.model, "generate", counting)
    monkeypatch.setattr(engine, "cfg", engine.cfg.model_copy(update=options))
    prompts = [[5 + i, 7, 9] for i in range(6)]
    gens = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=6, seed=1, ignore_eos=True))
    assert seen == rows
    assert [len(g) for g in gens] == [4] * 6 and all(len(s.token_ids) == 6 for g in gens for s in g)
