"""The megatron plugin is discoverable, listed as unavailable, and says clearly why."""

import pytest
from rlweave.config.errors import ConfigError
from rlweave.config.resolve import resolve_plugins
from rlweave.config.schema import RunConfig
from rlweave.plugins.manager import PluginManager


def _provided():
    pm = PluginManager()
    return pm, next(p for p in pm.providers("backend") if p.name == "megatron")


def test_megatron_record_is_registered_and_unavailable_with_its_reason():
    pm, provided = _provided()
    info = provided.plugin
    assert (info.entry_point, info.distribution, info.version, info.status) == \
        ("megatron", "rlweave-backend-megatron", "0.1.0", "ok")
    assert provided.record.parallel == ("dp", "tp", "pp")
    assert provided.status == "unavailable"
    assert provided.error.startswith("not implemented yet: megatron-core's distributed optimizer")
    row = next(r for r in pm.rows() if r["name"] == "megatron")
    assert (row["status"], row["error"]) == ("unavailable", provided.error)
    assert "megatron" not in pm.names("backend")


def test_loading_the_worker_raises_a_clear_not_implemented_error():
    _, provided = _provided()
    with pytest.raises(NotImplementedError, match="megatron-core training backend .* is not implemented yet.*CUDA"):
        provided.record.load()


def test_selecting_megatron_fails_at_validation_with_the_reason():
    pm, _ = _provided()
    cfg = RunConfig.model_validate({"roles": {"policy": {"backend": "megatron"}}})
    with pytest.raises(ConfigError) as err:
        resolve_plugins(cfg, pm, source="c.yaml")
    assert "c.yaml: roles.policy.backend: training backend 'megatron' (rlweave-backend-megatron 0.1.0) is " \
           "unavailable here: not implemented yet: megatron-core's distributed optimizer" in str(err.value)
