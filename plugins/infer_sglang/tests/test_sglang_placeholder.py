"""The SGLang plugin is discoverable, listed as unavailable, and says clearly why."""

import importlib.util

import pytest
import rlweave_infer_sglang
from rlweave.config.errors import ConfigError
from rlweave.config.resolve import resolve_plugins
from rlweave.config.schema import RunConfig
from rlweave.plugins.manager import PluginManager


def _provided():
    pm = PluginManager()
    return pm, next(p for p in pm.providers("engine") if p.name == "sglang")


def test_sglang_record_is_registered_and_unavailable_with_its_reason():
    pm, provided = _provided()
    info = provided.plugin
    assert (info.entry_point, info.distribution, info.version, info.status) == \
        ("sglang", "rlweave-infer-sglang", "0.1.0", "ok")
    assert provided.record.kind == "engine" and provided.record.parallel == ("tp",)
    assert provided.status == "unavailable"
    if importlib.util.find_spec("sglang") is None:
        assert provided.error == rlweave_infer_sglang.NOT_INSTALLED
        assert provided.error.startswith("SGLang is not installed")
    assert "not implemented yet" in provided.error
    row = next(r for r in pm.rows() if r["name"] == "sglang")
    assert (row["status"], row["error"]) == ("unavailable", provided.error)


def test_probe_says_not_implemented_when_sglang_is_installed(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "sglang" else real(name, *a))
    assert rlweave_infer_sglang.probe().startswith("not implemented yet: rlweave-infer-sglang has no engine")


def test_loading_the_engine_raises_a_clear_not_implemented_error():
    _, provided = _provided()
    with pytest.raises(NotImplementedError, match="SGLang rollout engine .* is not implemented yet.*CUDA"):
        provided.record.load()


def test_selecting_sglang_fails_at_validation_with_the_reason():
    pm, provided = _provided()
    cfg = RunConfig.model_validate({"roles": {"rollout": {"engine": "sglang"}}})
    with pytest.raises(ConfigError) as err:
        resolve_plugins(cfg, pm, source="c.yaml")
    assert f"c.yaml: roles.rollout.engine: inference engine 'sglang' (rlweave-infer-sglang 0.1.0) is " \
           f"unavailable here: {provided.error}" in str(err.value)
