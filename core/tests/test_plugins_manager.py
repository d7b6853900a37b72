"""PluginManager checks on in-process registrations (same code path as entry points)."""

from __future__ import annotations

import types

from rlweave.plugins import BackendRecord, RewardRecord, hookimpl
from rlweave.plugins.manager import PluginManager
from rlweave.plugins.selection import disabled_reason


def module(**attrs) -> types.ModuleType:
    mod = types.ModuleType("p")
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


def test_misspelled_hook_is_rejected_with_a_hint_even_without_the_marker():
    pm = PluginManager(load_entry_points=False)
    info = pm.register(module(rlweave_algorithm=lambda: []), name="typo")
    assert info.status == "broken"
    assert info.error.startswith("implements unknown hook rlweave_algorithm (did you mean rlweave_algorithms?)")


def test_record_of_the_wrong_kind_is_broken_and_none_is_empty():
    pm = PluginManager(load_entry_points=False)
    wrong = pm.register(module(rlweave_rewards=hookimpl(lambda: [BackendRecord("b", "s", "x:y")])), name="wrong")
    assert (wrong.status, wrong.records) == ("broken", [])
    assert wrong.error.startswith("TypeError: rlweave_rewards() returned BackendRecord")
    empty = pm.register(module(rlweave_rewards=hookimpl(lambda: None)), name="empty")
    assert (empty.status, empty.records) == ("ok", [])
    assert pm.names("reward") == []


def test_hook_with_arguments_the_spec_lacks_is_broken():
    pm = PluginManager(load_entry_points=False)
    info = pm.register(module(rlweave_rewards=hookimpl(lambda config: [])), name="args")
    assert info.status == "broken" and "config" in info.error


def test_rows_and_distributions():
    pm = PluginManager(load_entry_points=False)
    pm.register(module(rlweave_rewards=hookimpl(lambda: [RewardRecord("r", "a reward", "x:y")])),
                name="ep", distribution="rlweave-x", version="1.2")
    assert pm.rows() == [{"name": "r", "kind": "reward", "distribution": "rlweave-x", "version": "1.2",
                          "entry_point": "ep", "status": "ok", "summary": "a reward", "api_version": 1, "error": None}]
    assert pm.distributions() == {"rlweave-x": "1.2"}


def test_selection_rules():
    assert disabled_reason("fsdp", "rlweave-backend-fsdp", {}) is None
    assert disabled_reason("fsdp", "rlweave-backend-fsdp", {"RLWEAVE_PLUGINS": ""}) == "not in RLWEAVE_PLUGINS="
    assert disabled_reason("builtin-rewards", "rlweave", {"RLWEAVE_PLUGINS": ""}) is None
    assert disabled_reason("builtin-rewards", "rlweave", {"RLWEAVE_DISABLE_PLUGINS": "builtin_rewards"}) == \
        "disabled by RLWEAVE_DISABLE_PLUGINS=builtin_rewards"
    assert disabled_reason("fsdp", "rlweave-backend-fsdp", {"RLWEAVE_PLUGINS": "fsdp", "RLWEAVE_DISABLE_PLUGINS": "fsdp"}) \
        == "disabled by RLWEAVE_DISABLE_PLUGINS=fsdp"
