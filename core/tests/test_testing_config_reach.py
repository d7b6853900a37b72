"""The recorder and the verdict of config mutation tests (``rlweave.testing.config_reach`` /
``config_keys``) catch what they are for: a key never read, a key read under another name
(falling back to a default), a read of the wrong value, a stale exemption. Synthetic
consumers, pydantic only (the real runs are in tests/reliability/test_config_reach.py)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from rlweave.config.schema import RunConfig
from rlweave.testing.config_keys import Key, Universe, judge, key_universe, model_keys, mutations
from rlweave.testing.config_reach import AttrView, ModelView, Recorder, RecordingDict, similar_key


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = 1e-5
    warmup: int = 0


class Plugin(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = 4
    dead: bool = False
    inner: Inner = Inner()
    entries: list[Inner] = []
    tags: dict[str, int] = {}
    extra: dict[str, Any] = {}
    maybe: Inner | None = None

    @property
    def big(self) -> bool:
        return self.size > 8


def test_views_log_leaf_reads_with_their_values():
    rec = Recorder()
    view = ModelView(Plugin(size=9, inner=Inner(lr=0.5), entries=[Inner(warmup=3)], tags={"a": 1},
                            extra={"k": {"x": 2}}), "sec", rec)
    assert isinstance(view, Plugin)
    assert view.size == 9 and view.inner.lr == 0.5 and view.entries[0].warmup == 3
    assert [e.lr for e in view.entries] == [1e-5]
    assert view.tags == {"a": 1}  # a dict of plain values is one leaf
    assert view.extra["k"]["x"] == 2  # free-form dicts are sections
    assert view.big is True  # a property reads through the view
    assert view.maybe is None
    got = {(r.path, repr(r.value)) for r in rec.reads}
    assert got == {("sec.size", "9"), ("sec.inner.lr", "0.5"), ("sec.entries.0.warmup", "3"), ("sec.entries.0.lr", "1e-05"),
                   ("sec.tags", "{'a': 1}"), ("sec.extra.k.x", "2"), ("sec.maybe", "None")}
    view.size = 3  # assignments reach the model
    assert object.__getattribute__(view, "_obj").size == 3
    assert pickle.loads(pickle.dumps(view)) == Plugin(size=3, inner=Inner(lr=0.5), entries=[Inner(warmup=3)],
                                                      tags={"a": 1}, extra={"k": {"x": 2}})


def test_misses_name_the_key_a_misspelt_read_stands_for():
    rec = Recorder()
    view = ModelView(Plugin(), "algo", rec)
    assert getattr(view, "ppo_size", 7) == 7  # falls back to the reader's default
    opts = RecordingDict({"learning_rate": 0.1, "warmup_steps": 2}, "optim", rec)
    assert opts.get("learnig_rate", 1e-5) == 1e-5
    assert opts.get("unrelated", 1) == 1
    with pytest.raises(KeyError):
        opts["warmup"]
    assert [(m.path, m.close) for m in rec.misses] == [
        ("algo.ppo_size", "size"), ("optim.learnig_rate", "learning_rate"), ("optim.unrelated", None),
        ("optim.warmup", "warmup_steps")]
    assert similar_key("ppo_epochs", ["epochs", "append_eos"]) == "epochs"
    assert similar_key("ppo_epochs", ["append_eos", "max_length"]) is None


def test_copies_log_nothing_until_adopted_and_phases_tag_reads():
    rec = Recorder()
    view = ModelView(Plugin(inner=Inner(lr=0.25)), "s", rec)
    dumped = view.inner.model_dump()
    assert isinstance(dumped, RecordingDict) and rec.reads == []

    class Worker:
        def __init__(self, o):
            self.kept = dict(o)  # a plain copy, read later

    w = Worker(dumped)
    assert rec.adopt_copies(w) == ["kept"]
    with rec.in_phase("resolve"):
        assert w.kept["lr"] == 0.25
    with rec.paused():
        assert w.kept["warmup"] == 0
    assert [(r.path, r.phase) for r in rec.reads] == [("s.inner.lr", "resolve")]
    assert rec.values("s.inner.lr") == [] and rec.values("s.inner.lr", ("resolve",)) == [0.25]


def test_attr_view_and_model_factory_name_their_config_paths():
    rec = Recorder()

    @dataclass
    class Ctx:
        seed: int = 5
        role: str = "policy"
        config: dict = field(default_factory=dict)

    ctx = AttrView(Ctx(), {"seed": "run.seed"}, rec)
    assert ctx.seed == 5 and ctx.role == "policy" and isinstance(ctx, Ctx)
    make = rec.model_factory(Inner)
    assert type(make(lr=0.3)) is Inner  # no role: a plain model
    with rec.as_role("critic"):
        built = make(lr=0.3)
    assert built.lr == 0.3
    assert [(r.path, r.value) for r in rec.reads] == [("run.seed", 5), ("roles.critic.options.lr", 0.3)]


def _universe() -> Universe:
    uni = Universe()
    uni.keys.update(model_keys(Plugin, "algorithm", "toy", skip=("algorithm.extra",)))
    return uni


def test_model_keys_walk_sections_with_placeholders():
    keys = {str(k) for k in model_keys(RunConfig)}
    assert {"roles.<role>.optim.lr", "resources.pools.<pool>.strategy", "rewards.<i>.weight",
            "reward_runtime.sandbox.cpu_s", "algorithm.name", "roles.<role>.parallel", "kernels"} <= keys
    assert not any(".options" in k or ".args" in k for k in keys)  # plugin sections: from the plugins
    toy = {str(k) for k in _universe().keys}
    assert {"algorithm.size [toy]", "algorithm.inner.lr [toy]", "algorithm.maybe.warmup [toy]",
            "algorithm.entries.<i>.lr [toy]", "algorithm.tags [toy]"} <= toy


def test_judge_fails_unread_wrong_value_and_stale_exemptions():
    wanted = {"run.seed", "run.name", "run.total_steps", "run.keep_last", "run.log_every"}
    uni = Universe(keys={k: info for k, info in model_keys(RunConfig).items() if k.path in wanted})
    user = {"run": {"seed": 9, "name": "x", "total_steps": 3, "keep_last": 5, "log_every": 1}}
    cfg = RunConfig.model_validate(user)
    muts, problems = mutations(cfg, user, uni)
    assert problems == ["run.log_every = 1 is its default (run.log_every): not a mutation"]
    rec = Recorder()
    view = ModelView(cfg, "", rec)
    assert view.run.seed == 9  # read: passes
    with rec.in_phase("resolve"):
        assert view.run.name == "x"  # read while validating only: not a use
    rec.read("run.total_steps", 10)  # a read that got another value (e.g. a default from elsewhere)
    assert view.run.keep_last == 5  # read, but exempt: the exemption is stale
    verdicts = {str(v.key): v for v in judge(uni, [("toy", muts, rec)], exempt={Key("run.keep_last"): "why"})}
    assert verdicts["run.seed"].status == "read"
    assert verdicts["run.name"].status == "unread"
    assert verdicts["run.total_steps"].status == "wrong-value" and "read as ['10']" in verdicts["run.total_steps"].detail
    assert verdicts["run.keep_last"].status == "stale-exemption"
    assert verdicts["run.log_every"].status == "not-mutated"
    name = judge(uni, [("toy", muts, rec)], resolve_keys=[Key("run.name")])
    assert {str(v.key): v.status for v in name}["run.name"] == "read"


def test_reward_args_are_the_named_parameters_of_the_function():
    def reward(prompt, response, answer=None, mode="first", *, scale=1.0, **_):
        return 0.0

    @dataclass(frozen=True)
    class Rec:
        name: str = "toy_reward"
        config_model: Any = None

        def load(self):
            return reward

    @dataclass
    class Provided:
        record: Any
        status: str = "ok"
        error: Any = None

    class PM:
        def providers(self, kind):
            return [Provided(Rec())] if kind == "reward" else []

    uni = key_universe(PM(), {"toy_reward": ("answer",)})
    mine = {str(k): info.default for k, info in uni.keys.items() if k.plugin == "toy_reward"}
    assert mine == {"rewards.<i>.args.mode [toy_reward]": "first", "rewards.<i>.args.scale [toy_reward]": 1.0}
