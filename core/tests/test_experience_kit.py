"""The RL step toolkit's own contracts, on a stand-in engine and no trainer:

* a new reward source is one class (``reward_sources.register``): the toolkit then sums it
  with the rules on every step, and its metrics reach the step's row;
* the step's row has the same ``time/*`` columns every step, ``sync_bytes`` and ``time/sync``;
* the checkpoint state is format 2; states of earlier versions are migrated with a warning,
  and a newer format is refused naming the algorithm.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from rlweave.algo_helpers import reward_sources
from rlweave.algo_helpers.experience import STEP_TIMES, ExperienceKit
from rlweave.algo_helpers.kit_state import StateFormatError, migrate
from rlweave.algo_helpers.reward_sources import Contribution, RewardSource
from rlweave.interfaces.engine import Generation
from rlweave.testing.tiny_tokenizer import char_tokenizer

PHASES = {p: ("policy", "rollout") for p in ("generate", "experience", "train", "sync", "eval", "rest")}


def _done(value):
    f = Future()
    f.set_result(value)
    return f


class Engine:
    """Answers every prompt with ``"ab"`` and EOS."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompt_ids, params):
        ids = self.tok("ab", add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return _done([[Generation(ids, [-0.5] * len(ids), "stop") for _ in range(params.n)] for _ in prompt_ids])


class Rules:
    """A rule set paying 1.0 for every sample."""

    entries = ["one"]

    def score(self, samples):
        return [1.0] * len(samples), [{"one": 1.0} for _ in samples]


class Sync:
    def sync(self, src, dst, version=None):
        return {"bytes": 128, "seconds": 0.01}


class LengthBonus(RewardSource):
    """The new source of this test: ``bonus`` per response token, when the config asks for it."""

    name = "length_bonus"

    def __init__(self, bonus):
        self.bonus = bonus

    @classmethod
    def build(cls, ctx, config, wait):
        bonus = getattr(config, "length_bonus", 0.0)
        return cls(bonus) if bonus else None

    def collect(self, pending, batch):
        scores = self.bonus * batch.sample["response_len"].float()
        return Contribution(scores, {"reward/length_bonus": float(scores.mean())})


@pytest.fixture
def kit_of():
    tok = char_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789+="])
    made = []

    def make(**config):
        cfg = SimpleNamespace(n_samples=2, max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=-1, **config)
        ctx = SimpleNamespace(config=None, roles={"rollout": Engine(tok)}, tokenizer=tok, rewards=Rules(), seed=3,
                              weight_sync=Sync())
        kit = ExperienceKit(ctx, cfg, PHASES, ("policy", "rollout"), "test")
        made.append(kit)
        return kit

    yield make
    for kit in made:
        kit.close()


def test_a_new_reward_source_is_one_registered_class(kit_of, monkeypatch):
    monkeypatch.setattr(reward_sources, "SOURCES", list(reward_sources.SOURCES))
    reward_sources.register(LengthBonus)
    kit = kit_of(length_bonus=0.25)
    assert [s.name for s in kit.sources] == ["rules", "environment", "length_bonus"]
    records = [{"id": "a", "prompt": "1+1=", "answer": "2"}, {"id": "b", "prompt": "2+2=", "answer": "4"}]
    rows = []
    for _ in range(2):
        kit.begin_step()
        batch = kit.generate(records)
        trained = batch.token["loss_mask"] > 0  # a sync step: every token of the engine's current weights
        assert batch.token["staleness"][trained].tolist() == [0] * int(trained.sum())
        exp = kit.experience(batch, {})
        # rules pay 1, the bonus 0.25 per response token ("ab" + EOS)
        assert exp.scores.tolist() == [1.0 + 0.75] * 4
        rows.append(kit.finish(batch))
    assert rows[0]["reward/length_bonus"] == 0.75 and rows[0]["reward/rules"] == 1.0
    assert rows[0].keys() == rows[1].keys()
    assert {f"time/{k}" for k in STEP_TIMES} <= rows[0].keys()
    assert rows[1]["sync_bytes"] == 128.0 and rows[1]["time/sync"] == 0.01
    assert kit.state_dict() == {"format": 2, "steps_done": 2, "samples_seen": 8, "pipeline": {}}
    # without the setting the source does not apply
    assert [s.name for s in kit_of().sources] == ["rules", "environment"]


def test_states_of_earlier_versions_are_migrated_and_newer_ones_refused(caplog):
    ppo_v1 = {"steps_done": 3, "kl_ctl": {"value": 0.2}, "reward_moments": {"n": 4}, "ptx": None}
    with caplog.at_level(logging.WARNING, logger="rlweave.algo"):
        v2 = migrate(ppo_v1, "ppo")
    assert v2 == {"format": 2, "steps_done": 3, "kl": {"value": 0.2}, "reward_moments": {"n": 4}, "ptx": None}
    assert "written by an earlier rlweave (format 1)" in caplog.text and "kl_ctl -> kl" in caplog.text
    assert migrate({"steps": 5, "tied_total": 2}, "online_dpo") == {"format": 2, "steps_done": 5, "tied_total": 2}
    assert migrate({"steps_done": 1, "samples_seen": 8}, "grpo")["steps_done"] == 1  # GRPO's keys are unchanged
    assert migrate(v2, "ppo") == v2
    with pytest.raises(StateFormatError, match="grpo: .* format 3, newer than this rlweave reads"):
        migrate({"format": 3, "steps_done": 1}, "grpo")


def test_a_kit_restores_a_format_1_state(kit_of):
    kit = kit_of()
    state = kit.load_state_dict({"steps": 7, "tied_total": 1})
    assert (kit.steps_done, kit.samples_seen, state["tied_total"]) == (7, 0, 1)
    # the step's seed follows the restored counter
    assert kit.sampling().seed == kit_of().sampling().seed + 7 * 101


def test_mismatch_metrics_come_from_the_first_pass(kit_of, caplog):
    """Two passes of two mini-batches: the step's mismatch is the first pass's (each sample once),
    and a gap above the floor at the first step is warned about."""
    from rlweave.algo_parts.mismatch import mismatch_metrics, mismatch_sums
    from rlweave.algo_parts.spec import resolve

    kit = kit_of()
    kit.begin_step()
    batch = kit.generate([{"id": "a", "prompt": "1+1=", "answer": "2"}, {"id": "b", "prompt": "2+2=", "answer": "4"}])
    mbs = kit.mini_batches(batch, epochs=2, parts=2, shuffle=False, loss_agg=resolve("loss_agg", "token_mean"))
    assert len(mbs) == 4

    def row(mb, gap):
        on = mb.token["loss_mask"] > 0
        engine = mb.token["rollout_logprobs"]
        return mismatch_sums(engine + gap, engine, on, mb.sample_index(), len(mb), mb.token["staleness"])

    rows = [row(mbs[0], 0.1), row(mbs[1], 0.1), row(mbs[2], 5.0), row(mbs[3], 5.0)]
    kit.finish(batch)
    got = kit.mismatch(rows)
    assert got == mismatch_metrics(rows[:2]) and got["mismatch/k2"] == pytest.approx(0.005)
    assert got["mismatch/stale0/tokens_frac"] == 1.0
    assert any("train/inference mismatch at step 1" in r.getMessage() for r in caplog.records)
