"""Hub model names in model.path, resolved through a Hugging Face cache written here in the real
layout (models--org--name/{refs,snapshots}); nothing is downloaded."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from rlweave.config.errors import ConfigError
from rlweave.config.hub import HubModelError, localize, resolve
from rlweave.config.loader import load_config
from rlweave.config.rundir import write_run_dir

_spec = importlib.util.spec_from_file_location("rlweave_test_fakes", Path(__file__).parent / "plugin_dists" / "fakes.py")
fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)

OLD, NEW = "1" * 40, "2" * 40


def cache_model(cache: Path, name: str, commit: str, refs: tuple[str, ...] = ("main",), vocab: int = 64) -> Path:
    """Save a tiny model (and tokenizer files) as the snapshot ``commit`` of hub repo ``name``."""
    from rlweave.testing.tiny_model import build_tiny_qwen2

    repo = cache / ("models--" + name.replace("/", "--"))
    snap = build_tiny_qwen2(repo / "snapshots" / commit, vocab_size=vocab, hidden=32, layers=1, heads=2, kv_heads=1,
                            ffn=32)
    (snap / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    Path("train.jsonl").write_text('{"prompt": "1+1=", "answer": 2}\n')
    return tmp_path / "hub"


def config(**model) -> dict:
    return {"resources": {"pools": {"default": {"devices_per_node": 2}}},
            "roles": {"policy": {"backend": "fsdp"}, "rollout": {"engine": "vllm"}},
            "algorithm": {"name": "grpo"}, "model": model, "data": {"train": "train.jsonl"}}


def load(data: dict):
    Path("c.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config("c.yaml", pm=fakes.make_pm())


def errors(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load(data)
    return [str(i) for i in err.value.issues]


def test_a_cached_hub_model_validates_loads_and_is_recorded_with_its_commit(cache):
    old = cache_model(cache, "org/tiny", OLD, refs=("v1",))
    new = cache_model(cache, "org/tiny", NEW, refs=("main",), vocab=96)
    cfg, resolved = load(config(path="org/tiny"))
    assert cfg.model.path == "org/tiny"  # the config keeps the name; the runner reads the snapshot
    local, found = localize(cfg)
    assert local.model.path == str(new) and found["model.path"].commit == NEW and cfg.model.path == "org/tiny"

    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(local.model.path).vocab_size == 96

    for revision, snap, commit in (("v1", old, OLD), (OLD, old, OLD), ("main", new, NEW)):
        cfg, resolved = load(config(path="org/tiny", revision=revision))
        assert localize(cfg)[0].model.path == str(snap)
        write_run_dir(Path("runs") / revision, cfg, fakes.make_pm(), resolved)
        report = json.loads((Path("runs") / revision / "plugins.json").read_text())
        assert report["models"] == {"model.path": {"name": "org/tiny", "revision": revision, "commit": commit,
                                                   "path": str(snap)}}
    Path("local").mkdir()
    cfg, resolved = load(config(path="local"))
    write_run_dir("runs/local", cfg, fakes.make_pm(), resolved)
    assert "models" not in json.loads(Path("runs/local/plugins.json").read_text())


def test_the_tokenizer_and_role_models_resolve_too(cache):
    cache_model(cache, "org/tiny", OLD, refs=("main", "v1"))
    snap = cache_model(cache, "org/other", NEW)
    data = config(path="org/tiny", revision="v1", tokenizer="org/tiny")
    data["roles"]["policy"]["model"] = {"path": "org/other"}
    cfg, _ = load(data)
    local, found = localize(cfg)
    assert sorted(found) == ["model.path", "model.tokenizer", "roles.policy.model.path"]
    assert found["model.tokenizer"].commit == OLD and local.roles["policy"].model.path == str(snap)


def test_a_model_missing_from_the_cache_is_a_config_error_saying_how_to_get_it(cache):
    cache_model(cache, "org/tiny", OLD)
    how = "download it first with `hf download {0}` (older huggingface_hub: `huggingface-cli download {0}`)"
    assert errors(config(path="Qwen/Qwen2.5-0.5B")) == [
        f"c.yaml: model.path: 'Qwen/Qwen2.5-0.5B' is neither a local directory nor a hub model in the Hugging Face "
        f"cache ({cache}): for a hub model, {how.format('Qwen/Qwen2.5-0.5B')}; nothing is downloaded during a run"]
    assert errors(config(path="org/tiny", revision="v2")) == [
        f"c.yaml: model.path: 'org/tiny' is neither a local directory nor a hub model at revision 'v2' in the Hugging "
        f"Face cache ({cache}): for a hub model, {how.format('org/tiny --revision v2')}; nothing is downloaded during "
        "a run"]
    (cache / "models--org--tiny" / "snapshots" / OLD / "config.json").unlink()  # a partial download
    with pytest.raises(HubModelError, match=r"has no config.json \(only part of the model was downloaded\)|"
                                            r"has no config.json: only part of the model was downloaded"):
        resolve("org/tiny")
    Path("local").mkdir()
    assert errors(config(path="local", revision="v1")) == [
        "c.yaml: model.revision: applies to hub names only; model.path 'local' is a local directory"]


def test_a_cache_changed_after_validation_names_the_key(cache):
    cache_model(cache, "org/tiny", OLD)
    cfg, _ = load(config(path="org/tiny"))
    (cache / "models--org--tiny" / "refs" / "main").unlink()
    with pytest.raises(HubModelError) as err:
        localize(cfg)
    assert err.value.key == "model.path" and "hf download org/tiny" in str(err.value)
