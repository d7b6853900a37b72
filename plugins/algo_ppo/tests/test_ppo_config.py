"""PPOConfig validation, the roles PPO asks for, and a light plugin module."""

import subprocess
import sys

import pytest
from pydantic import ValidationError

from rlweave_algo_ppo.config import PPOConfig, ppo_roles


def test_roles_follow_config():
    assert ppo_roles(PPOConfig()) == ("policy", "rollout", "reference", "critic", "reward")
    assert ppo_roles(PPOConfig(kl={"beta": 0.0})) == ("policy", "rollout", "critic", "reward")
    assert "reference" in ppo_roles(PPOConfig(kl={"beta": 0.1, "target": 1.0}))
    two = PPOConfig(reward_models=[{"role": "reward", "weight": 0.7}, {"role": "reward_safety", "weight": 0.3}])
    assert ppo_roles(two)[-2:] == ("reward", "reward_safety")
    assert ppo_roles(PPOConfig(reward_models=[])) == ("policy", "rollout", "reference", "critic")
    assert ppo_roles({"name": "ppo", "kl": {"beta": 0}}) == ("policy", "rollout", "critic", "reward")


def test_config_errors_are_explicit():
    with pytest.raises(ValidationError, match="ptx_data"):
        PPOConfig(ptx_coef=0.1)
    with pytest.raises(ValidationError, match="start with 'reward'"):
        PPOConfig(reward_models=[{"role": "critic"}])
    with pytest.raises(ValidationError, match="listed twice"):
        PPOConfig(reward_models=[{"role": "reward"}, {"role": "reward"}])
    with pytest.raises(ValidationError):
        PPOConfig(gamma_typo=1.0)


@pytest.mark.parametrize("key, where", [("clip_low", "policy_loss: {name: ppo_clip"),
                                        ("clip_high", "policy_loss: {name: ppo_clip"),
                                        ("gamma", "advantage: {name: gae"), ("lam", "advantage: {name: gae"),
                                        ("kl_coef", "kl: {beta"), ("kl_estimator", "kl: {estimator"),
                                        ("kl_clamp", "kl: {clamp"), ("kl_target", "kl: {target"),
                                        ("kl_horizon", "kl: {horizon")])
def test_keys_of_earlier_versions_are_refused_with_their_new_place(key, where):
    with pytest.raises(ValidationError, match=rf"'{key}' is no longer a key of algorithm: use {where}"):
        PPOConfig.model_validate({key: 0.9})


def test_named_parts_are_checked():
    cfg = PPOConfig(advantage={"name": "gae", "gamma": 0.99, "lam": 0.9}, kl={"estimator": "k3", "clamp": None},
                    policy_loss={"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.28})
    assert cfg.advantage.options == {"gamma": 0.99, "lam": 0.9} and cfg.kl.clamp is None
    assert cfg.policy_loss.options == {"clip_low": 0.2, "clip_high": 0.28} and cfg.kl.estimator.name == "k3"
    default = PPOConfig()
    assert (default.advantage.name, default.policy_loss.name, default.kl.estimator.name) == ("gae", "ppo_clip", "k1")
    assert (default.kl.clamp, default.kl.beta, default.kl.in_reward, default.kl.target) == (10.0, 0.05, True, None)
    with pytest.raises(ValidationError, match="uses no critic"):
        PPOConfig(advantage="grpo")
    with pytest.raises(ValidationError, match="lam"):
        PPOConfig(advantage={"name": "gae", "lam": 2.0})
    with pytest.raises(ValidationError, match="unknown KL estimator 'k4'"):
        PPOConfig(kl={"estimator": "k4"})
    with pytest.raises(ValidationError, match="clamp"):
        PPOConfig(kl={"clamp": 0})
    with pytest.raises(ValidationError, match="kl.target .* needs kl.in_reward"):
        PPOConfig(kl={"target": 1.0, "in_reward": False})
    with pytest.raises(ValidationError, match="dual_clip"):
        PPOConfig(policy_loss={"name": "ppo_clip", "dual_clip": 0.5})


def test_every_field_is_described():
    for name, field in PPOConfig.model_fields.items():
        assert field.description, name


def test_plugin_module_is_light():
    code = ("import sys, rlweave_algo_ppo.plugin as p; recs = p.rlweave_algorithms(); "
            "assert recs[0].name == 'ppo'; print(sorted(m for m in ('torch', 'ray', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
