"""The hf plugin's record and config."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlweave_infer_hf import plugin
from rlweave_infer_hf.config import HFEngineConfig


def test_record_points_at_engine():
    (record,) = plugin.rlweave_inference_engines()
    assert record.name == "hf" and record.config_model is HFEngineConfig
    from rlweave.interfaces.engine import RolloutEngine

    assert issubclass(record.load(), RolloutEngine)


def test_config_is_strict_and_documented():
    with pytest.raises(ValidationError):
        HFEngineConfig(max_model_len=16, typo=1)
    with pytest.raises(ValidationError):
        HFEngineConfig(long_prompt="drop")
    for name, field in HFEngineConfig.model_fields.items():
        assert field.description, name


def test_plugin_import_is_light():
    import subprocess
    import sys

    code = ("import sys, rlweave_infer_hf.plugin, rlweave_infer_hf.config, rlweave.engine_helpers.requests, "
            "rlweave.engine_helpers.consistency; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
