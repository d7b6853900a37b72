"""``rlweave eval``: exact match, mean reward and pass@k on the tiny trained model, for real.

* from the run config alone (its eval data, rewards, eval settings): the same numbers the run
  logged for its final evaluation (``summary.json``), since it is the same evaluation;
* with ``--data`` / ``--rewards`` (a user ``file.py:function`` with a weight) and ``--n`` samples:
  exact match, mean reward and pass@k of a reward that is right on a known quarter of the
  records; with ``arith_exact`` pass@k grows with k;
* the pass@k estimator against hand-computed values;
* bad input is one line and exit code 2.
"""

from __future__ import annotations

import json

import pytest
from rlweave.commands.evaluate import pass_at_k

# right exactly on the 4 held-out prompts "4-0=" .. "4-3=" (of 16), whatever the model answers
FOURS = "def fours(prompt, response, answer, **fields):\n    return 1.0 if prompt.startswith('4-') else 0.0\n"


def test_eval_of_a_run_equals_the_runs_own_final_evaluation(cli, trained_run):
    result = cli("eval", trained_run.config, "--json")
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout)
    final = json.loads((trained_run.run_dir / "summary.json").read_text())["eval_after"]
    assert m["model"] == f"{trained_run.run_dir / 'hf'} (step 2)" and m["records"] == 16
    assert m["max_tokens"] == 3 and m["threshold"] == 1.0  # the run's eval_max_new_tokens, eval_threshold
    assert m["exact_match"] == final["eval/accuracy"]
    assert m["reward_mean"] == pytest.approx(final["eval/reward_mean"])
    assert m["response_len"] == final["eval/response_len"]
    assert "pass@1" not in m  # no sampling unless --n > 1


def test_eval_with_data_rewards_and_pass_at_k(cli, trained_run, tmp_path):
    (tmp_path / "fours.py").write_text(FOURS)
    hf, test = trained_run.run_dir / "hf", trained_run.ws.test
    result = cli("eval", hf, "--data", test, "--rewards", f"{tmp_path / 'fours.py'}:fours=2", "--n", 4,
                 "--threshold", 2, "--max-tokens", 3, "--json")
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout)
    assert (m["exact_match"], m["reward_mean"]) == (0.25, 0.5)
    assert (m["pass@1"], m["pass@4"], m["sampled_reward_mean"]) == (0.25, 0.25, 0.5)

    result = cli("eval", hf, "--data", test, "--rewards", "arith_exact", "--n", 4, "--k", 1, "--k", 2, "--k", 4,
                 "--temperature", 1.5, "--limit", 8)
    assert result.exit_code == 0, result.output
    table = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert table["records"] == "8" and table["rewards"] == "arith_exact"
    p1, p2, p4 = (float(table[f"pass@{k}"]) for k in (1, 2, 4))
    assert 0.0 <= p1 <= p2 <= p4 <= 1.0 and 0.0 <= float(table["exact_match"]) <= 1.0


def test_pass_at_k_estimator():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k wrong samples
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_bad_input_is_one_line_and_exit_2(cli, expect_error, trained_run, tmp_path):
    hf, test = trained_run.run_dir / "hf", trained_run.ws.test
    expect_error(cli("eval", hf, "--data", test, "--rewards", "arith_exat"), "unknown reward 'arith_exat' (--rewards)",
                 "Did you mean 'arith_exact'?")
    expect_error(cli("eval", hf, "--data", test, "--rewards", "no_such_module:fn"), "no_such_module")
    expect_error(cli("eval", hf, "--data", test, "--rewards", "arith_exact=heavy"), "weight", "number")
    expect_error(cli("eval", hf, "--rewards", "arith_exact"), "--data is required")
    expect_error(cli("eval", hf, "--data", test), "--rewards is required")
    expect_error(cli("eval", hf, "--data", tmp_path / "nope.jsonl", "--rewards", "arith_exact"), "nope.jsonl",
                 "not found")
    expect_error(cli("eval", hf, "--data", test, "--rewards", "arith_exact", "--n", 2, "--k", 3), "--k 3", "--n")
