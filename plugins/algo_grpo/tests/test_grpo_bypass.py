"""GRPO with ``algorithm.off_policy.mode``: which log-prob passes a step issues (bypass never
issues the old-log-prob pass, whatever needs old log-probs in decoupled mode), and the KL in the
reward taking the engine's log-probs as the old ones in bypass mode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlweave.algo_helpers.kl_penalty import KLPenalty
from rlweave.data.batch import Batch
from rlweave_algo_grpo.algorithm import GRPO
from rlweave_algo_grpo.config import GRPOConfig


class Role:
    """A role handle that records the passes asked of it."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def logprobs(self, batch, **kw):
        self.calls.append(self.name)
        return None


def passes(**algorithm) -> list[str]:
    """The passes a GRPO step of this config issues for a batch, in the order issued."""
    cfg = GRPOConfig.model_validate({"name": "grpo", **algorithm})
    algo = GRPO.__new__(GRPO)  # the step's own decisions, without workers
    algo.config, algo.kl = cfg, KLPenalty(cfg.kl)
    calls: list[str] = []
    algo.ctx = SimpleNamespace(roles={"policy": Role("policy", calls), "reference": Role("reference", calls)})
    for call in algo._passes(Batch.from_sequences([[1, 2, 3]], prompt_lens=[1])).values():
        call()
    return calls


SEVERAL_UPDATES = {"ppo_epochs": 2, "mini_batches": 2}
KL_IN_REWARD = {"kl": {"beta": 0.1, "in_reward": True}}


@pytest.mark.parametrize("settings", [{}, SEVERAL_UPDATES, KL_IN_REWARD, {**SEVERAL_UPDATES, **KL_IN_REWARD}])
def test_bypass_never_recomputes_the_old_logprobs(settings):
    bypass = passes(**settings, off_policy={"correction": "icepop", "mode": "bypass"})
    decoupled = passes(**settings, off_policy={"correction": "icepop"})
    assert "policy" not in bypass
    assert ("policy" in decoupled) == bool(settings)  # one update and no KL in the reward: not needed either
    assert bypass == [c for c in decoupled if c != "policy"]


def test_a_correction_that_needs_the_proximal_policy_gets_it_with_one_update():
    assert passes(off_policy={"correction": "decoupled"}) == ["policy"]
    assert passes(off_policy={"correction": "tis"}) == []


def test_kl_in_the_reward_reads_the_engines_logprobs_in_bypass_mode():
    kl = KLPenalty(GRPOConfig.model_validate({"name": "grpo", **KL_IN_REWARD}).kl)
    b = Batch.from_sequences([[1, 2, 3]], prompt_lens=[1])
    b.add_token("rollout_logprobs", torch.tensor([0.0, -1.0, -2.0]))
    b.add_token("ref_logprobs", torch.tensor([0.0, -1.5, -2.0]))
    metrics: dict = {}
    rewards = kl.reward(b, metrics, old="rollout_logprobs")
    k3 = torch.exp(torch.tensor(-0.5)) + 0.5 - 1.0  # r = ref - old = -0.5 on the first response token
    assert rewards.tolist() == pytest.approx([0.0, -0.1 * float(k3), 0.0])
    with pytest.raises(KeyError, match="old_logprobs"):
        kl.reward(b, {})  # decoupled: the recomputed ones, which this batch lacks
