"""GRPOConfig and the roles GRPO asks for (light: no torch needed)."""

import pytest
from pydantic import ValidationError

from rlweave_algo_grpo.config import GRPOConfig, grpo_roles


def test_reference_role_only_with_kl():
    assert grpo_roles(GRPOConfig(kl={"beta": 0.0})) == ("policy", "rollout")
    assert grpo_roles(GRPOConfig(kl={"beta": 0.04})) == ("policy", "rollout", "reference")
    assert grpo_roles({"name": "grpo", "kl": {"beta": 0.04}}) == ("policy", "rollout", "reference")
    assert grpo_roles(GRPOConfig(reward_models=[{"role": "reward"}])) == ("policy", "rollout", "reward")


def test_every_field_is_described_and_unknown_keys_fail():
    for name, f in GRPOConfig.model_fields.items():
        assert f.description, name
    with pytest.raises(ValidationError, match="n_sample"):
        GRPOConfig.model_validate({"n_sample": 4})
    with pytest.raises(ValidationError, match=r"kl\.in_reward needs kl\.beta"):
        GRPOConfig(kl={"in_reward": True})
    with pytest.raises(ValidationError, match="overlong_buffer"):
        GRPOConfig(max_new_tokens=8, overlong_buffer=8)


@pytest.mark.parametrize("key, where", [("clip_low", "policy_loss"), ("clip_high", "policy_loss"),
                                        ("scale_rewards", "dr_grpo"), ("adv_eps", "advantage"),
                                        ("kl_beta", "kl: {beta"), ("kl_estimator", "kl: {estimator"),
                                        ("kl_in_reward", "kl: {in_reward")])
def test_keys_of_earlier_versions_are_refused_with_their_new_place(key, where):
    with pytest.raises(ValidationError, match=rf"'{key}' is no longer a key of algorithm: use .*{where}"):
        GRPOConfig.model_validate({key: 0.1})


def test_named_parts_are_checked():
    cfg = GRPOConfig(advantage="rloo", policy_loss={"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.28},
                     loss_agg="seq_mean", kl={"beta": 0.1, "estimator": "k1"})
    assert cfg.policy_loss.options == {"clip_low": 0.2, "clip_high": 0.28} and cfg.kl.estimator.name == "k1"
    assert GRPOConfig().advantage.name == "grpo" and GRPOConfig().policy_loss.name == "ppo_clip"
    with pytest.raises(ValidationError, match="Did you mean 'rloo'"):
        GRPOConfig(advantage="rlooo")
    with pytest.raises(ValidationError, match="needs a critic's values"):
        GRPOConfig(advantage="gae")
    with pytest.raises(ValidationError, match="clip_hi"):
        GRPOConfig(policy_loss={"name": "ppo_clip", "clip_hi": 0.3})
    with pytest.raises(ValidationError, match="unknown KL estimator 'k9'"):
        GRPOConfig(kl={"estimator": "k9"})
    with pytest.raises(ValidationError, match="dynamic_sampling"):
        GRPOConfig(advantage="remax", dynamic_sampling=True)


def test_plugin_record_is_light():
    import subprocess
    import sys

    code = (
        "import sys; import rlweave_algo_grpo.plugin as p; r = p.rlweave_algorithms()[0]; "
        "assert r.name == 'grpo'; bad = [m for m in ('torch', 'ray', 'vllm') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
