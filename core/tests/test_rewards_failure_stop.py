"""The failing-reward stop: a scoring where more than ``max_failed_share`` of one reward's
calls fail raises RewardFailureError (training and held-out evaluation alike)."""

import pickle
import textwrap
from collections import Counter

import pytest
from rlweave.rewards import RewardFailureError, RewardSet
from rlweave.rewards.failures import failure_stop
from rlweave.rewards.sections import RewardEntry, RewardsRuntime

USER = textwrap.dedent(
    """
    import time

    def flaky(prompt, response, **_):
        if response.startswith("bad"):
            raise KeyError("no luck")
        return 1.0

    def slow(prompt, response, **_):
        time.sleep(100)
    """
)


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    import sys

    d = tmp_path_factory.mktemp("failstop")
    (d / "failstop_rewards_f.py").write_text(USER)
    sys.path.insert(0, str(d))
    yield "failstop_rewards_f"
    sys.path.remove(str(d))


def samples(n, **fields):
    return [{"id": f"s{k}", "prompt": f"{k}+1=", "response": str(k + 1), **fields} for k in range(n)]


def test_records_without_the_needed_field_stop_the_scoring():
    with RewardSet([{"name": "arith_exact"}], RewardsRuntime(workers=2)) as rs, \
            pytest.raises(RewardFailureError) as info:
        rs.score(samples(8))
    err = info.value
    text = str(err)
    assert text.startswith("reward 'arith_exact' (rewards.0.name): 8 of 8 calls failed (8 error; first, on record "
                           "'s0': ValueError: arith_exact needs an 'answer' field in the data record)")
    assert "the samples have fields ['id', 'prompt', 'response']" in text
    assert "the data records may lack a field the reward needs" in text
    assert text.endswith("reward_runtime.max_failed_share is 0.5 (1.0: never stop)")
    assert (err.reward, err.failed, err.total, err.key, err.record_id) == ("arith_exact", 8, 8, "rewards.0.name", "s0")
    assert "Traceback" in err.details and "needs an 'answer' field" in err.details  # the worker's, for the error log
    assert isinstance(err, RuntimeError)


def test_share_one_never_stops_and_a_minority_of_failures_goes_on(user_module):
    with RewardSet([{"name": "arith_exact"}], RewardsRuntime(workers=1, max_failed_share=1.0,
                                                            failure_reward=-1.0)) as rs:
        totals, rows = rs.score(samples(4))
        assert totals == [-1.0] * 4 and all(r["failed"] == ["arith_exact"] for r in rows)
    entries = [RewardEntry(name=f"{user_module}:flaky")]
    with RewardSet(entries, RewardsRuntime(workers=1)) as rs:  # 2 of 4 is not more than half
        batch = samples(4)
        batch[0]["response"] = batch[1]["response"] = "bad"
        totals, _ = rs.score(batch)
        assert totals == [0.0, 0.0, 1.0, 1.0]
        batch[2]["response"] = "bad"  # 3 of 4 is
        with pytest.raises(RewardFailureError, match=r"flaky' \(rewards.0.name\): 3 of 4 calls failed \(3 error; first, on record 's0': KeyError"):
            rs.score(batch)


def test_the_stop_names_the_failing_reward_among_several(user_module):
    entries = [RewardEntry(name="arith_exact"), RewardEntry(name=f"{user_module}:flaky", weight=0.5)]
    with RewardSet(entries, RewardsRuntime(workers=2)) as rs:
        batch = samples(3, answer=0)
        for s in batch:
            s["response"] = "bad" + s["response"]
        with pytest.raises(RewardFailureError, match=f"^reward '{user_module}:flaky' \\(rewards.1.name\\): 3 of 3 calls failed") as info:
            rs.score(batch)
        assert info.value.reward == f"{user_module}:flaky"
        assert rs.stats["error"] == 3 and rs.stats["calls"] == 6  # counted before the stop


def test_timeouts_count_as_failures(user_module):
    runtime = RewardsRuntime(workers=2, timeout_s=0.5)
    with RewardSet([{"name": f"{user_module}:slow"}], runtime) as rs, \
            pytest.raises(RewardFailureError, match=r"2 of 2 calls failed \(2 timeout;.*reward_runtime\.timeout_s"):
        rs.score(samples(2))


def test_failure_stop_rule():
    assert failure_stop("r", Counter(error=5), 10, "E: x", 0.5, []) is None  # not more than half
    assert failure_stop("r", Counter(error=1), 10, "E: x", 0.0, []) is not None  # 0.0: any failure
    assert failure_stop("r", Counter(error=10), 10, "E: x", 1.0, []) is None  # 1.0: never
    err = failure_stop("r", Counter(crash=2, error=4), 6, "E: x\nTraceback...", 0.5, ["prompt"])
    assert str(err).startswith("reward 'r': 6 of 6 calls failed (4 error, 2 crash; first: E: x)")
    assert pickle.loads(pickle.dumps(err)).__dict__ == err.__dict__ and str(pickle.loads(pickle.dumps(err))) == str(err)


def test_the_runner_does_not_treat_it_as_a_lost_worker():
    from rlweave.runner.recovery import lost_roles

    assert lost_roles(RewardFailureError("reward 'x': 1 of 1 calls failed"), ["policy", "rollout"]) == {}


def test_held_out_evaluation_stops_too():
    from rlweave.algo_helpers.evaluate import exact_match
    from rlweave.interfaces.engine import Generation

    class Tok:
        eos_token_id = 0
        chat_template = None

        def __call__(self, text):
            return {"input_ids": [ord(c) for c in text]}

        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids if i)

    class Echo:
        def generate(self, prompts, params):
            return [[Generation([ord("2"), 0], [-0.1, -0.1], "stop")] for _ in prompts]

    records = [{"id": str(k), "prompt": "1+1="} for k in range(3)]  # no 'answer'
    with RewardSet([{"name": "arith_exact"}], RewardsRuntime(workers=1)) as rs:
        with pytest.raises(RewardFailureError, match=r"^held-out evaluation on 3 records: reward 'arith_exact' "
                                                     r"\(rewards.0.name\): 3 of 3 calls failed \(3 error; first, "
                                                     r"on record '0': ValueError") as info:
            exact_match(Echo(), Tok(), records, rs)
        assert info.value.reward == "arith_exact"
        assert exact_match(Echo(), Tok(), [dict(r, answer="2") for r in records], rs)["accuracy"] == 1.0
