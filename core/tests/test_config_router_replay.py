"""``algorithm.router_replay`` against the policy backend's record (rlweave.config.router_replay):
the backends whose record says ``router_replay`` (fsdp, megatron) pass, any other is refused with a
message naming them."""

from __future__ import annotations

import json
from types import SimpleNamespace as S

import pytest

from rlweave.config.router_replay import KEY, router_replay_problems
from rlweave.plugins.manager import PluginManager


@pytest.fixture
def cfg(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 8}))
    return S(roles={"policy": S(model=None)}, model=S(path=str(tmp_path)))


def _backend(name: str):
    """The installed backend's record (skipped where its plugin is not installed)."""
    try:
        return PluginManager().get("backend", name)
    except Exception as exc:  # noqa: BLE001 - any unavailable plugin
        pytest.skip(f"backend {name}: {exc}")


@pytest.mark.parametrize("mode", ["r2", "r3"])
def test_a_backend_whose_record_replays_passes(cfg, mode):
    algo = S(router_replay=mode, off_policy=None)
    for name in ("fsdp", "megatron"):
        assert router_replay_problems(cfg, algo, {"policy": _backend(name)}, rollout_started=False) == []


def test_a_backend_without_replay_is_refused_naming_those_with_it(cfg):
    algo = S(router_replay="r2", off_policy=None)
    problems = router_replay_problems(cfg, algo, {"policy": _backend("deepspeed")}, rollout_started=False)
    assert problems == [(KEY, "router_replay r2: backend 'deepspeed' (roles.policy.backend) does not replay MoE "
                              "routing; use backend fsdp or megatron, or set algorithm.router_replay: none")]
