"""The SGLang plugin is discoverable and says clearly that it is not implemented."""

import pytest

from rlweave.config.errors import ConfigError
from rlweave.config.resolve import resolve_plugins
from rlweave.config.schema import RunConfig
from rlweave.plugins.manager import PluginManager


def _record():
    pm = PluginManager()
    return pm, pm.get("engine", "sglang")


def test_sglang_record_is_registered_by_its_entry_point():
    pm, record = _record()
    info = next(p for p in pm.plugins if p.entry_point == "sglang")
    assert (info.distribution, info.version, info.status) == ("rlweave-infer-sglang", "0.1.0", "ok")
    assert record.kind == "engine" and record.parallel == ("tp",)


def test_loading_the_engine_raises_a_clear_not_implemented_error():
    _, record = _record()
    with pytest.raises(NotImplementedError, match="SGLang rollout engine .* is not implemented yet.*CUDA"):
        record.load()


def test_selecting_sglang_fails_at_validation_with_the_reason():
    pm, _ = _record()
    cfg = RunConfig.model_validate({"roles": {"rollout": {"engine": "sglang"}}})
    with pytest.raises(ConfigError) as err:
        resolve_plugins(cfg, pm, source="c.yaml")
    assert "c.yaml: roles.rollout.options: the SGLang rollout engine (rlweave-infer-sglang) " \
           "is not implemented yet" in str(err.value)
