"""Residency: which roles move in which phase, in which order, and with which calls."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlweave.residency import EVAL_PHASES, Residency, colocated_roles

PHASES = {"generate": ("rollout",), "experience": ("policy", "reference", "reward*"), "train": ("policy",),
          "sync": ("policy", "rollout"), "rest": ("policy", "rollout")}


class Done:
    def result(self):
        return {}


class Handle:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def __getattr__(self, method):
        def call(*a, **k):
            self.log.append((self.name, method))
            return Done()

        return call


def residency(mode="auto", colocate=(("policy", "rollout", "reference", "reward_a"),), roles=None):
    log: list = []
    roles = roles or ("policy", "rollout", "reference", "reward_a")
    return Residency({r: Handle(r, log) for r in roles}, PHASES, colocate, mode), log


def test_idle_roles_go_out_before_needed_ones_come_in():
    res, log = residency()
    res.enter("generate")
    assert log == [("policy", "offload"), ("reference", "offload"), ("reward_a", "offload")]
    log.clear()
    res.enter("experience")  # the engine sleeps first, then the scorers come back
    assert log == [("rollout", "sleep"), ("policy", "onload"), ("reference", "onload"), ("reward_a", "onload")]
    log.clear()
    res.enter("sync")
    assert log == [("reference", "offload"), ("reward_a", "offload"), ("rollout", "wake_up")]
    assert res.moves[-1] == ("sync", "rollout", "in")
    log.clear()
    res.enter("rest")
    assert log == []  # already there
    assert res.resident == {"policy": True, "rollout": True, "reference": False, "reward_a": False}


def test_modes():
    res, log = residency(mode="never")
    res.enter("generate")
    assert log == [] and res.movable == set()
    res, log = residency(colocate=[("policy", "rollout")])  # auto: only roles sharing devices move
    res.enter("experience")
    assert log == [("rollout", "sleep")]
    res, log = residency(mode="always", colocate=[])
    res.enter("train")
    assert {r for r, _ in log} == {"rollout", "reference", "reward_a"}
    with pytest.raises(ValueError, match="resources.offload"):
        residency(mode="sometimes")


def test_only_and_during():
    res, log = residency(mode="always")
    res.enter("experience")
    log.clear()
    res.only("reference", "experience")
    assert log == [("policy", "offload"), ("reward_a", "offload")]
    assert res.moving("policy", "reference") and not residency(colocate=[])[0].moving("policy")
    log.clear()
    assert res.during("generate", lambda x: x * 2, 21) == 42
    assert ("rollout", "wake_up") in log and log[-1] == ("policy", "onload")  # back to rest afterwards
    with pytest.raises(KeyError, match="unknown phase 'score'"):
        res.enter("score")


def test_for_run_reads_the_resources_section():
    log: list = []
    roles = {r: Handle(r, log) for r in ("policy", "rollout")}
    cfg = SimpleNamespace(resources=SimpleNamespace(colocate=[["policy", "rollout"]], offload="auto"))
    res = Residency.for_run(SimpleNamespace(roles=roles, config=cfg), ("policy", "reference", "rollout"), EVAL_PHASES)
    assert set(res.roles) == {"policy", "rollout"} and res.movable == {"policy", "rollout"}
    res.enter("rest")  # SFT/DPO train: the evaluation engine sleeps
    assert log == [("rollout", "sleep")]
    res = Residency.for_run(SimpleNamespace(roles=roles, config=None), ("policy", "rollout"), EVAL_PHASES)
    assert res.movable == set()
    assert colocated_roles([["a", "b"], ["c", "x"]], ["a", "b", "c"]) == {"a", "b"}
