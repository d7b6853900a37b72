"""RMConfig and the light ``rm`` entry point."""

import subprocess
import sys

import pytest
from pydantic import ValidationError

from rlweave_algo_sft.rm_config import RMConfig, rm_roles


def test_rm_config_fields_described_and_strict():
    for name, field in RMConfig.model_fields.items():
        assert field.description, name
    assert rm_roles(RMConfig()) == ("policy",)
    with pytest.raises(ValidationError):
        RMConfig(margin="huge")
    with pytest.raises(ValidationError):
        RMConfig(unknown=1)


def test_rm_plugin_module_is_light():
    code = ("import sys, rlweave_algo_sft.rm_plugin as p; r = p.rlweave_algorithms()[0]; "
            "assert r.name == 'rm' and r.target.endswith(':RewardModelTraining'); "
            "print(sorted(m for m in ('torch', 'ray', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
