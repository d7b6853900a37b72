"""The megatron plugin is discoverable and says clearly that it is not implemented."""

import pytest

from rlweave.config.errors import ConfigError
from rlweave.config.resolve import resolve_plugins
from rlweave.config.schema import RunConfig
from rlweave.plugins.manager import PluginManager


def _record():
    pm = PluginManager()
    return pm, pm.get("backend", "megatron")


def test_megatron_record_is_registered_by_its_entry_point():
    pm, record = _record()
    info = next(p for p in pm.plugins if p.entry_point == "megatron")
    assert (info.distribution, info.version, info.status) == ("rlweave-backend-megatron", "0.1.0", "ok")
    assert record.parallel == ("dp", "tp", "pp")
    assert "not implemented" in record.summary


def test_loading_the_worker_raises_a_clear_not_implemented_error():
    _, record = _record()
    with pytest.raises(NotImplementedError, match="megatron-core training backend .* is not implemented yet.*CUDA"):
        record.load()


def test_selecting_megatron_fails_at_validation_with_the_reason():
    pm, _ = _record()
    cfg = RunConfig.model_validate({"roles": {"policy": {"backend": "megatron"}}})
    with pytest.raises(ConfigError) as err:
        resolve_plugins(cfg, pm, source="c.yaml")
    assert "c.yaml: roles.policy.options: the megatron-core training backend (rlweave-backend-megatron) " \
           "is not implemented yet" in str(err.value)
