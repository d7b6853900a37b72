"""RewardSet: worker processes, timeouts, crashes, weights, plugin resolution."""

import logging
import textwrap

import pytest

from rlweave.rewards import RewardSet, load_reward_fn, reward_records
from rlweave.sandbox.pool import RewardWorkerError
from rlweave.rewards.rules import arith_exact
from rlweave.rewards.sections import RewardEntry, RewardsRuntime

USER_REWARDS = textwrap.dedent(
    """
    import os, signal, time

    def length(prompt, response, scale=1.0, **_):
        return scale * len(response)

    def needs_answer(prompt, response, answer, **fields):
        return 1.0 if "extra" in fields and answer == 7 else 0.0

    def bad(prompt, response, **_):
        if response == "raise":
            raise RuntimeError("boom")
        if response == "hang":
            time.sleep(10**6)
        if response == "exit":
            os._exit(3)
        if response == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if response == "nan":
            return float("nan")
        if response == "text":
            return "not a number"
        return 1.0
    """
)


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    import sys

    d = tmp_path_factory.mktemp("userrewards")
    (d / "my_rewards_e.py").write_text(USER_REWARDS)
    sys.path.insert(0, str(d))  # spawn children inherit the parent's sys.path
    yield "my_rewards_e"
    sys.path.remove(str(d))


def test_builtin_rewards_come_through_the_hook():
    import pluggy

    from rlweave.plugins import hookspecs
    from rlweave.rewards import plugin

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(plugin)
    recs = reward_records(pm)
    assert set(recs) >= {"arith_exact", "math_boxed", "format"}
    assert load_reward_fn("arith_exact", pm) is arith_exact
    assert load_reward_fn("arith_exact") is arith_exact  # no pm: built-ins only


def test_unknown_and_broken_names():
    with pytest.raises(ValueError, match="Did you mean 'arith_exact'"):
        load_reward_fn("arith_exakt")
    with pytest.raises(ImportError, match="no_such_module_xyz"):
        load_reward_fn("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match=r"rewards\[1\]"):
        RewardSet([{"name": "arith_exact"}, {"name": "nope"}])
    with pytest.raises(ValueError, match="no rewards"):
        RewardSet([])


def test_weights_breakdown_and_fields(user_module):
    entries = [
        RewardEntry(name="arith_exact", weight=2.0),
        RewardEntry(name=f"{user_module}:length", weight=0.5, args={"scale": 2.0}),
        RewardEntry(name=f"{user_module}:needs_answer"),
        RewardEntry(name="arith_exact", weight=-1.0),
    ]
    with RewardSet(entries, RewardsRuntime(workers=2, timeout_s=20)) as rs:
        samples = [
            {"prompt": "3+4=", "response": "7", "answer": 7, "extra": 1},
            {"prompt": "3+4=", "response": "8", "answer": 7},
        ]
        totals, rows = rs.score(samples)
        assert rows[0] == {"arith_exact": 1.0, f"{user_module}:length": 2.0, f"{user_module}:needs_answer": 1.0,
                           "arith_exact#2": 1.0, "failed": []}
        assert totals[0] == pytest.approx(2.0 + 0.5 * 2.0 + 1.0 - 1.0)
        assert totals[1] == pytest.approx(0.0 + 0.5 * 2.0 + 0.0 - 0.0)
        assert rs.score([]) == ([], [])


def test_failures_do_not_stop_scoring(user_module, caplog):
    # 6 of 10 calls fail on purpose: above the default share that stops a run (test_rewards_failure_stop.py)
    runtime = RewardsRuntime(workers=2, timeout_s=3.0, failure_reward=-1.0, max_failed_share=1.0)
    entries = [RewardEntry(name=f"{user_module}:bad"), RewardEntry(name="arith_exact", weight=10.0)]
    responses = ["1", "raise", "hang", "1", "exit", "segv", "nan", "text", "1", "1"]
    with RewardSet(entries, runtime) as rs, caplog.at_level(logging.WARNING, logger="rlweave.rewards"):
        totals, rows = rs.score([{"prompt": "0+1=", "response": r, "answer": 1} for r in responses])
        name = f"{user_module}:bad"
        for r, row, total in zip(responses, rows, totals):
            if r == "1":
                assert row == {name: 1.0, "arith_exact": 1.0, "failed": []}
                assert total == 11.0
            else:
                assert row[name] == -1.0 and row["failed"] == [name], r
                # the other reward still counts
                assert total == pytest.approx(-1.0 + 10.0 * row["arith_exact"])
        assert rs.stats["timeout"] == 1 and rs.stats["crash"] == 2 and rs.stats["error"] == 3
        text = caplog.text
        assert "timeout" in text and "crash" in text and "boom" in text
        # the pool replaced the dead and hung workers: scoring still works
        totals, rows = rs.score([{"prompt": "0+1=", "response": "1", "answer": 1}] * 4)
        assert totals == [11.0] * 4
        assert rs._pool.replaced == 3


def test_worker_cannot_import_reward(tmp_path, monkeypatch):
    # importable here (parent), missing in the spawned worker: a config error, raised
    (tmp_path / "only_in_parent_e.py").write_text("def f(prompt, response, **_):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rs = RewardSet([{"name": "only_in_parent_e:f"}], RewardsRuntime(workers=1))
    (tmp_path / "only_in_parent_e.py").write_text("raise ImportError('gone in the worker')\n")
    import importlib
    import sys

    sys.modules.pop("only_in_parent_e", None)
    importlib.invalidate_caches()
    with pytest.raises(RewardWorkerError, match="gone in the worker"):
        rs.score([{"prompt": "p", "response": "r"}])
    rs.close()


def test_reward_from_file_path(tmp_path, monkeypatch):
    (tmp_path / "rw.py").write_text("def r(prompt, response, bonus=0.0, **_):\n    return len(prompt) + bonus\n")
    monkeypatch.chdir(tmp_path)
    assert load_reward_fn("rw.py:r")("abc", "") == 3
    with RewardSet([{"name": "rw.py:r", "args": {"bonus": 0.5}}], RewardsRuntime(workers=1)) as rs:
        monkeypatch.chdir("/")  # the path was made absolute when resolved
        assert rs.score([{"prompt": "ab", "response": ""}])[0] == [2.5]
    with pytest.raises(ImportError, match="not found"):
        load_reward_fn("missing_file.py:r")
