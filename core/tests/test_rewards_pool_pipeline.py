"""RewardPool hands a worker its next call before the current one answers: every call still
gets its own outcome, and calls queued behind one that kills or hangs its worker still run."""

import textwrap

import pytest

from rlweave.sandbox.pool import PIPELINE, RewardPool

REWARDS = textwrap.dedent(
    """
    import os, time

    def echo(value, **_):
        if value == -1:
            os._exit(3)
        if value == -2:
            time.sleep(10**6)
        return float(value)
    """
)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipeline")
    (d / "pipeline_rewards.py").write_text(REWARDS)
    return f"{d / 'pipeline_rewards.py'}:echo"


def test_each_call_gets_its_own_outcome_in_order(target):
    assert PIPELINE >= 2  # otherwise this file tests nothing new
    pool = RewardPool([target], workers=1, timeout_s=2.0)
    try:
        values = [3, -1, 5, 7, -2, 11, 13]
        out = pool.run([(0, {"value": v}) for v in values])
        assert [s for s, _ in out] == ["ok", "crash", "ok", "ok", "timeout", "ok", "ok"]
        assert [p for s, p in out if s == "ok"] == [3.0, 5.0, 7.0, 11.0, 13.0]
        assert pool.replaced == 2
        many = pool.run([(0, {"value": v}) for v in range(200)])
        assert many == [("ok", float(v)) for v in range(200)]
    finally:
        pool.close()
