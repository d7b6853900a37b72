"""PluginManager checks on in-process registrations (same code path as entry points)."""

from __future__ import annotations

import types

import pytest

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


def test_a_record_whose_probe_gives_a_reason_is_unavailable_for_every_kind():
    from rlweave.plugins import AlgorithmRecord, EngineRecord, KernelRecord
    from rlweave.plugins.errors import PluginUnavailableError

    calls = []

    def not_here():
        calls.append(1)
        return "not implemented yet (needs CUDA)"

    pm = PluginManager(load_entry_points=False)
    pm.register(module(
        rlweave_training_backends=hookimpl(lambda: [BackendRecord("mega", "s", "x:y", probe=not_here),
                                                    BackendRecord("fine", "s", "x:y", probe=lambda: None)]),
        rlweave_inference_engines=hookimpl(lambda: [EngineRecord("eng", "s", "x:y", probe=lambda: "sglang is not installed")]),
        rlweave_algorithms=hookimpl(lambda: [AlgorithmRecord("alg", "s", "x:y", probe=lambda: "needs a GPU")]),
        rlweave_rewards=hookimpl(lambda: [RewardRecord("rew", "s", "x:y", probe=lambda: "no judge model")]),
        rlweave_kernels=hookimpl(lambda: [KernelRecord("ker", "s", "x:y", probe=lambda: "needs Triton")])),
        name="ep", distribution="rlweave-x", version="1.2")
    rows = {r["name"]: (r["status"], r["error"]) for r in pm.rows()}
    assert rows == {"mega": ("unavailable", "not implemented yet (needs CUDA)"), "fine": ("ok", None),
                    "eng": ("unavailable", "sglang is not installed"), "alg": ("unavailable", "needs a GPU"),
                    "rew": ("unavailable", "no judge model"), "ker": ("unavailable", "needs Triton")}
    assert pm.plugins[0].status == "ok"  # the plugin loaded; its records cannot run here
    assert pm.names("backend") == ["fine"]
    with pytest.raises(PluginUnavailableError) as err:
        pm.get("backend", "mega", where="c.yaml: roles.policy.backend")
    assert str(err.value) == ("training backend 'mega' (rlweave-x 1.2; c.yaml: roles.policy.backend) is unavailable "
                              "here: not implemented yet (needs CUDA)")
    pm.rows()
    assert len(calls) == 1  # probed once per manager


def test_a_probe_that_raises_makes_its_record_broken_not_the_listing():
    pm = PluginManager(load_entry_points=False)

    def bad_probe():
        raise OSError("no /proc here")

    pm.register(module(rlweave_rewards=hookimpl(lambda: [RewardRecord("r", "s", "x:y", probe=bad_probe)])),
                name="ep", distribution="rlweave-x", version="1.2")
    (row,) = pm.rows()
    assert (row["status"], row["error"]) == ("broken", "probe() of reward 'r' raised OSError: no /proc here")
