"""Plugin sections are strict whatever the plugin's model says: unknown keys are errors at
every depth (plain ``BaseModel``, ``extra="allow"``, nested models, aliases), while
``dict[str, Any]`` fields stay free-form."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config
from rlweave.config.strict import accepted_keys, split_unknown
from rlweave.plugins import AlgorithmRecord, BackendRecord, RewardRecord

_spec = importlib.util.spec_from_file_location("rlweave_test_fakes", Path(__file__).parent / "plugin_dists" / "fakes.py")
fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)


class Stage(BaseModel):  # pydantic's default: extra keys ignored
    length: int = 1


class LaxAlgo(BaseModel):
    clip_high: float = 0.2
    schedule: Stage | None = None
    stages: list[Stage] = Field(default_factory=list)
    by_role: dict[str, Stage] = Field(default_factory=dict)
    free: dict[str, Any] = Field(default_factory=dict)


class AliasedOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    micro_batch: int = Field(1, alias="microBatch")
    lr_scale: float = Field(1.0, validation_alias=AliasChoices("lr_scale", "lrScale"))


class LooseArgs(BaseModel):
    model_config = ConfigDict(extra="allow")
    pattern: str = "x"


def make_pm():
    pm = fakes.make_pm()
    pm.register(fakes.plugin(
        rlweave_algorithms=lambda: [AlgorithmRecord("lax", "lax algo", "x:y", LaxAlgo, roles=lambda cfg: ("policy",))],
        rlweave_training_backends=lambda: [BackendRecord("aliased", "aliased backend", "x:y", AliasedOptions)],
        rlweave_rewards=lambda: [RewardRecord("loose", "loose reward", "x:y", LooseArgs)]),
        name="lax", distribution="rlweave-lax", version="1.0")
    return pm


def load(tmp_path, data):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config(path, pm=make_pm())


def errors(tmp_path, data) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, data)
    return [str(i).split(": ", 1)[1] for i in err.value.issues]


def config(algorithm=None, options=None, args=None):
    return {"algorithm": {"name": "lax", **(algorithm or {})},
            "roles": {"policy": {"backend": "aliased", "options": options or {}}},
            "rewards": [{"name": "loose", "args": args or {}}]}


def test_typos_in_plain_and_extra_allow_models_are_errors_at_every_depth(tmp_path):
    assert errors(tmp_path, config(
        algorithm={"clip_hgh": 0.3, "schedule": {"lenght": 2}, "stages": [{"length": 1}, {"lenght": 2}],
                   "by_role": {"policy": {"lenth": 3}}, "free": {"anything": {"goes": 1}}},
        options={"microBatch": 2, "micro_bach": 3, "xyz": 1}, args={"patern": "y"})) == [
        "algorithm.clip_hgh: unknown key. Did you mean 'clip_high'?",
        "algorithm.schedule.lenght: unknown key. Did you mean 'length'?",
        "algorithm.stages.1.lenght: unknown key. Did you mean 'length'?",
        "algorithm.by_role.policy.lenth: unknown key. Did you mean 'length'?",
        "roles.policy.options.micro_bach: unknown key. Did you mean 'microBatch'?",
        "roles.policy.options.xyz: unknown key (allowed: microBatch, lr_scale, lrScale)",
        "rewards.0.args.patern: unknown key. Did you mean 'pattern'?"]


def test_value_errors_come_before_the_unknown_keys_of_one_section(tmp_path):
    assert errors(tmp_path, config(algorithm={"clip_hgh": 0.3, "clip_high": "wide"})) == [
        "algorithm.clip_high: Input should be a valid number, unable to parse string as a number (got 'wide')",
        "algorithm.clip_hgh: unknown key. Did you mean 'clip_high'?"]


def test_aliases_are_the_keys_and_the_resolved_config_keeps_them(tmp_path):
    cfg, resolved = load(tmp_path, config(algorithm={"stages": [{"length": 4}], "free": {"k": [1]}},
                                          options={"microBatch": 2, "lrScale": 0.5}))
    assert cfg.roles["policy"].options == {"microBatch": 2, "lr_scale": 0.5}
    assert resolved.role_options["policy"].micro_batch == 2
    assert cfg.algorithm.model_extra["stages"] == [{"length": 4}] and cfg.algorithm.model_extra["free"] == {"k": [1]}
    assert errors(tmp_path, config(options={"micro_batch": 2})) == [
        "roles.policy.options.micro_batch: unknown key. Did you mean 'microBatch'?"]


def test_accepted_keys_follow_the_models_alias_settings():
    class ByName(BaseModel):
        model_config = ConfigDict(populate_by_name=True)
        micro_batch: int = Field(1, alias="microBatch")

    assert accepted_keys(AliasedOptions) == {"microBatch": "micro_batch", "lr_scale": "lr_scale", "lrScale": "lr_scale"}
    assert accepted_keys(ByName) == {"microBatch": "micro_batch", "micro_batch": "micro_batch"}
    clean, found = split_unknown(LaxAlgo, {"stages": "not a list", "free": {"x": 1}, "oops": 1})
    assert clean == {"stages": "not a list", "free": {"x": 1}}  # pydantic reports the type
    assert found == [(("oops",), "unknown key (allowed: clip_high, schedule, stages, by_role, free)")]
