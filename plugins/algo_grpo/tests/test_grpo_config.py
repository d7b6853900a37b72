"""GRPOConfig and the roles GRPO asks for (light: no torch needed)."""

import pytest
from pydantic import ValidationError

from rlweave_algo_grpo.config import GRPOConfig, grpo_roles


def test_reference_role_only_with_kl():
    assert grpo_roles(GRPOConfig(kl_beta=0.0)) == ("policy", "rollout")
    assert grpo_roles(GRPOConfig(kl_beta=0.04)) == ("policy", "rollout", "reference")


def test_every_field_is_described_and_unknown_keys_fail():
    for name, f in GRPOConfig.model_fields.items():
        assert f.description, name
    with pytest.raises(ValidationError, match="n_sample"):
        GRPOConfig.model_validate({"n_sample": 4})
    with pytest.raises(ValidationError, match="kl_in_reward needs kl_beta"):
        GRPOConfig(kl_in_reward=True)
    with pytest.raises(ValidationError, match="overlong_buffer"):
        GRPOConfig(max_new_tokens=8, overlong_buffer=8)


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
