"""The named parts through the whole config loader: every shipped estimator config validates with
the roles it needs, and bad names, options and combinations are refused at their key path before
any worker starts."""

from pathlib import Path

import pytest

from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config

REPO = Path(__file__).resolve().parents[3]
EST = sorted((REPO / "examples" / "arith" / "estimators").glob("*.yaml"))


def test_there_is_a_config_per_estimator_row():
    assert {p.stem for p in EST} == {"dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax", "gspo",
                                     "grpo_rm"}


@pytest.mark.parametrize("path", EST, ids=lambda p: p.stem)
def test_estimator_configs_validate(path):
    cfg, resolved = load_config(path, check_inputs=False)
    expect = ("policy", "rollout", "reward") if path.stem == "grpo_rm" else ("policy", "rollout")
    assert resolved.role_names == expect
    if path.stem not in ("gspo", "grpo_rm"):
        assert resolved.algorithm_config.advantage.name == path.stem


@pytest.mark.parametrize("override,where,words", [
    ("algorithm.advantage=rlooo", "algorithm.advantage", ["unknown advantage estimator 'rlooo'", "Did you mean 'rloo'"]),
    ("algorithm.advantage=gae", "algorithm.advantage", ["needs a critic"]),
    ("algorithm.policy_loss={name: gspo, clip_hi: 1}", "algorithm.policy_loss", ["clip_hi"]),
    ("algorithm.loss_agg=seq_avg", "algorithm.loss_agg", ["unknown loss aggregation", "seq_mean"]),
    ("algorithm.kl={estimator: k4, beta: 0.1}", "algorithm.kl.estimator", ["unknown KL estimator 'k4'"]),
    ("algorithm.clip_high=0.3", "algorithm.clip_high", ["no longer a key", "policy_loss: {name: ppo_clip"]),
    ("algorithm.kl_beta=0.1", "algorithm.kl_beta", ["no longer a key", "kl: {beta"]),
    ("algorithm.advantage=my_missing_module:estimator", "algorithm.advantage", ["module 'my_missing_module' of advantage estimator 'my_missing_module:estimator' not found"]),
])
def test_bad_parts_are_refused_at_their_key(override, where, words):
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "examples/arith/grpo.yaml", [override], check_inputs=False)
    text = str(err.value)
    assert f"grpo.yaml: {where}:" in text, text
    for w in words:
        assert w in text, text


def test_remax_refuses_the_modes_it_cannot_run():
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        load_config(REPO / "examples/arith/estimators/remax.yaml", ["algorithm.dynamic_sampling=true"],
                    check_inputs=False)
    with pytest.raises(ConfigError, match="run.mode"):
        load_config(REPO / "examples/arith/estimators/remax.yaml", ["run.mode=one_step_off"], check_inputs=False)


def test_a_reward_model_role_must_be_configured():
    with pytest.raises(ConfigError, match="reward"):
        load_config(REPO / "examples/arith/grpo.yaml", ["algorithm.reward_models=[{role: reward}]"],
                    check_inputs=False)


def test_a_user_function_is_a_part(tmp_path, monkeypatch):
    (tmp_path / "my_est.py").write_text("def centred(*, scores, groups, mask, cu_seqlens, **_):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg, _ = load_config(REPO / "examples/arith/grpo.yaml", ["algorithm.advantage=my_est:centred"],
                         check_inputs=False)
    assert "my_est:centred" in str(cfg.algorithm)
