"""Rule rewards overlapped with generation (:mod:`rlweave.algo_helpers.reward_overlap`): a real
:class:`~rlweave.rewards.RewardSet` (sandboxed worker processes) scores the group of a record whose
episodes ended while another record's episodes still run, and the step gets exactly the totals,
breakdown and failure-share stop of scoring the whole batch at once. The episodes are the
multi-turn rollout's, the engine a scripted stand-in (the rewards are the subject)."""

from __future__ import annotations

import textwrap
import threading
import time

import pytest
import torch
from rlweave.algo_helpers.multi_turn import MultiTurnRollout
from rlweave.algo_helpers.multi_turn_config import MultiTurnConfig
from rlweave.algo_helpers.reward_sources import RuleRewards
from rlweave.interfaces.engine import Generation, SamplingParams
from rlweave.interfaces.environment import Environment, EnvStep
from rlweave.rewards import RewardSet
from rlweave.rewards.failures import RewardFailureError
from rlweave.rewards.sections import RewardsRuntime
from rlweave.testing.tiny_tokenizer import char_tokenizer

REWARDS = textwrap.dedent(
    """
    import time

    def stamped(prompt, response, log, **_):
        with open(log, "a") as f:
            f.write(f"{time.time()}\\n")
        return len(response) / 10

    def picky(prompt, response, **_):
        if "bad" in response:
            raise ValueError("no bad answers")
        return 1.0
    """
)
SLOW_S = 1.0  # how long the slow record's episodes take after their model turn


class Timed(Environment):
    """One model turn per episode; the episodes of the record ``slow`` take :data:`SLOW_S` in their
    step. Every episode's end time goes to :attr:`ends`."""

    ends: list[tuple[str, float]] = []
    lock = threading.Lock()

    def reset(self, record):
        self.name = record["prompt"]
        return [{"role": "user", "content": record["prompt"]}]

    def step(self, action):
        if self.name == "slow":
            time.sleep(SLOW_S)
        with Timed.lock:
            Timed.ends.append((self.name, time.time()))
        return EnvStep(done=True)


def engine_for(tok):
    """A scripted engine: episodes of the record ``fast`` answer ``bad <k>``, those of ``slow``
    ``good <k>`` (``k``: the episode's place in the call, so a group's samples differ)."""

    def generate(prompts, params: SamplingParams):
        out = []
        for k, p in enumerate(prompts):
            text = ("bad " if "fast" in tok.decode(p) else "good ") + str(k)
            ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            out.append([Generation(ids, [-0.5] * len(ids), "stop", versions=[0] * len(ids))])
        return out

    return generate


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789 :<>|_\n"])


@pytest.fixture(scope="module")
def reward_module(tmp_path_factory):
    import sys

    d = tmp_path_factory.mktemp("overlap_rewards")
    (d / "overlap_rewards_fns.py").write_text(REWARDS)
    sys.path.insert(0, str(d))  # spawned workers inherit the parent's sys.path
    yield "overlap_rewards_fns"
    sys.path.remove(str(d))


def _episodes(tok, source):
    """Two records of two episodes each through the multi-turn rollout the source wraps."""
    cfg = MultiTurnConfig.model_validate({"env": {"name": "tools", "args": {"tools": []}}, "max_turns": 2})
    inner = MultiTurnRollout(cfg, Timed, None, tok)
    try:
        rollout = source.during_rollout(inner)
        records = [{"id": "f", "prompt": "fast"}, {"id": "s", "prompt": "slow"}]
        return rollout.run(records, 2, SamplingParams(max_new_tokens=8, seed=1), engine_for(tok))
    finally:
        inner.close()


def test_a_finished_group_is_scored_while_others_run_with_the_sequential_result(tok, reward_module, tmp_path):
    log = tmp_path / "calls.log"
    rules = RewardSet([{"name": f"{reward_module}:stamped", "args": {"log": str(log)}},
                       {"name": f"{reward_module}:picky", "weight": 0.5}],
                      RewardsRuntime(workers=2, max_failed_share=0.5))
    try:
        rules.score([{"prompt": "warm", "response": "up"}])  # the workers are started
        log.write_text("")
        overlapped = RuleRewards(rules, tok, overlap=True)
        Timed.ends = []
        batch = _episodes(tok, overlapped)
        part = overlapped.collect(None, batch)
        overlapped.close()
        calls = sorted(float(x) for x in log.read_text().split())
        last_end = max(t for _, t in Timed.ends)
        first_slow_end = min(t for name, t in Timed.ends if name == "slow")
        # the fast record's reward calls ran while the slow record's episodes were still going
        assert len(calls) == 4 and calls[0] < first_slow_end - 0.3 and calls[0] < last_end
        assert part.metrics["time/reward/overlapped"] > 0 and part.metrics["time/reward/wait"] >= 0

        sequential = RuleRewards(rules, tok, overlap=False).collect(None, batch)
        assert torch.equal(part.scores, sequential.scores)
        assert part.breakdown == sequential.breakdown
        # the failures of the fast group (2 of 4 calls of 'picky') are tallied over the whole batch: half
        # of the calls, not above max_failed_share (the fast group alone failed all of its calls)
        assert [row["failed"] for row in part.breakdown] == [["overlap_rewards_fns:picky"]] * 2 + [[]] * 2
        assert part.metrics["reward/rules"] == sequential.metrics["reward/rules"]
    finally:
        rules.close()


def test_the_failure_share_stop_is_that_of_the_whole_batch(tok, reward_module, tmp_path):
    """More than ``max_failed_share`` of one reward's calls failed: both paths raise the same error,
    naming the first failing record."""
    rules = RewardSet([{"name": f"{reward_module}:picky"}], RewardsRuntime(workers=2, max_failed_share=0.25))
    try:
        errors = []
        for overlap in (True, False):
            source = RuleRewards(rules, tok, overlap=overlap)
            batch = _episodes(tok, source)
            with pytest.raises(RewardFailureError) as info:
                source.collect(None, batch)
            source.close()
            errors.append(info.value)
        assert str(errors[0]) == str(errors[1])
        assert errors[0].failed == 2 and errors[0].total == 4 and errors[0].record_id == "f/0"
    finally:
        rules.close()


def test_a_rollout_that_does_not_report_groups_is_scored_after_generation(tok):
    class Plain:
        reports_groups = False

    rules = RewardSet([{"name": "arith_exact"}])
    try:
        source = RuleRewards(rules, tok, overlap=True)
        plain = Plain()
        assert source.during_rollout(plain) is plain
        source.close()
    finally:
        rules.close()
