"""The main job's configs (examples/arith/sft.yaml, grpo.yaml) validate, both passes (their
models are built by earlier stages, so the input checks are core/tests/test_config_examples.py's)."""

from pathlib import Path

import pytest

from rlweave.config.loader import load_config

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name,roles", [("sft.yaml", ("policy",)), ("grpo.yaml", ("policy", "rollout"))])
def test_example_config_validates(name, roles):
    cfg, resolved = load_config(REPO / "examples/arith" / name, check_inputs=False)
    assert resolved.role_names == roles
    assert cfg.data.eval.endswith("test.jsonl") and "test" not in cfg.data.train
