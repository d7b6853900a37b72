"""User code that fails inside a real run ends it with one line naming it, its config key, the
record and the run's error log (``<run_dir>/logs/errors.log``, which holds the traceback); exit
code 1, nothing left running. Tiny GRPO runs through ``rlweave train`` (in process: FSDP
policy, HF engine):

* an environment (``path/to/file.py:Class``) whose second ``step()`` raises;
* a reward (``path/to/file.py:function``) that raises on every non-empty response: the
  validation dry run (an empty response) passes, the held-out evaluation before the first step
  stops on the failure share.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rlweave.testing.runs import cli_env, leftovers, run_cli

pytestmark = pytest.mark.slow
ENV = f"{Path(__file__).with_name('multi_turn_scenarios.py')}:Failing"
BAD_REWARD = """
def picky(prompt, response, **fields):
    if response:
        raise LookupError(f"cannot read {response!r}")
    return 0.0
"""


def _one_error_line(out: str) -> str:
    """The run's single ``error:`` line, which is its last line; no traceback on the console."""
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert "Traceback" not in out, out[-4000:]
    assert len(errors) == 1, out[-4000:]
    return errors[0]


def test_an_environment_whose_step_raises_ends_the_run_with_one_line(grpo_workspace):
    ws = grpo_workspace
    cfg = ws.config("mt-failing", 2, run={"scheduler": "in_process"},
                    algorithm={"multi_turn": {"env": {"name": ENV}, "max_turns": 3, "max_total_tokens": 40,
                                              "end_on_length": False}})
    rc, out, pids = run_cli(["train", str(cfg)], cli_env())
    log = ws.root / "runs" / "mt-failing" / "logs" / "errors.log"
    assert rc == 1, out[-4000:]
    line = _one_error_line(out)
    assert line.startswith(f"error: environment '{ENV}' (algorithm.multi_turn.env.name) failed in step() on "
                           "record '"), line
    assert "': ValueError: no move after " in line and line.endswith(f"; full traceback in {log}"), line
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "in step" in text and "ValueError: no move after" in text
    assert not leftovers(pids)


def test_a_reward_that_fails_too_often_ends_the_run_with_one_line(grpo_workspace):
    ws = grpo_workspace
    (ws.root / "picky_reward.py").write_text(BAD_REWARD)
    cfg = ws.config("rw-failing", 2, run={"scheduler": "in_process"},
                    rewards=[{"name": "arith_exact"}, {"name": "picky_reward.py:picky"}])
    rc, out, pids = run_cli(["train", str(cfg)], cli_env(), cwd=ws.root)
    log = ws.root / "runs" / "rw-failing" / "logs" / "errors.log"
    assert rc == 1, out[-4000:]
    line = _one_error_line(out)
    assert "reward 'picky_reward.py:picky' (rewards.1.name): 16 of 16 calls failed (16 error; first, on record '" \
        in line, line
    assert "': LookupError: cannot read " in line and line.endswith(f"; full traceback in {log}"), line
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "LookupError: cannot read" in text
    assert not leftovers(pids)
