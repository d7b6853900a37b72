"""The FSDP backend's device choices (rlweave.backend_helpers.hf_model.cpu.choices) with an injected bf16
speed: unchanged on CPUs with fast bf16, fp32 paths and a warning on CPUs with slow bf16;
and the CPU attention's fp32 forward for bf16 inputs."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from rlweave.devices.cpu import Bf16Speed
from rlweave.backend_helpers.hf_model.cpu import choices as cpu_choices
from rlweave_backend_fsdp.config import FSDPConfig

FAST = Bf16Speed(ratio=0.15, capability="AVX512", onednn_bf16=True)  # AMX-like
SLOW = Bf16Speed(ratio=97.0, capability="AVX2", onednn_bf16=False)  # AVX2-only


def _before(cfg: FSDPConfig, device: str, bf16: bool) -> tuple[bool, str, str]:
    """The resolution as it was before bf16 speed was considered (kernels, backward, scope)."""
    kernels = cfg.cpu.kernels == "rlweave" if cfg.cpu.kernels != "auto" else device == "cpu" and bf16
    if cfg.cpu.attention_backward != "auto":
        backward = cfg.cpu.attention_backward
    else:
        backward = "bf16" if cfg.compile and kernels else "fp32"
    scope = cfg.compile_scope if cfg.compile_scope != "auto" else ("layer" if device == "cuda" else "mlp_norms")
    return kernels, backward, scope


OPTIONS = list(itertools.product(["auto", "rlweave", "torch"], ["auto", "fp32", "bf16"], [False, True],
                                 ["auto", "layer", "mlp_norms"], ["cpu", "cuda"], [False, True]))


@pytest.fixture
def no_probe(monkeypatch):
    """Fail if the real probe runs: the injected speed must be the only one consulted."""
    def probe():
        raise AssertionError("bf16 probe ran")
    monkeypatch.setattr(cpu_choices, "bf16_speed", probe)


@pytest.mark.parametrize("kernels, backward, compile, scope, device, bf16", OPTIONS)
def test_fast_bf16_cpu_resolves_as_before(no_probe, kernels, backward, compile, scope, device, bf16):
    cfg = FSDPConfig(cpu={"kernels": kernels, "attention_backward": backward}, compile=compile, compile_scope=scope)
    got = cpu_choices.resolve(cfg, device, bf16, FAST)
    assert (got.kernels, got.attention_backward, got.compile_scope) == _before(cfg, device, bf16)
    assert got.compiled_logprobs == (compile and device == "cpu")  # the log-prob kernels: compile on CPU
    assert got.attention_forward == "input" and not got.bf16_slow
    assert cpu_choices.warning(got, cfg, "float32", "policy", 0, backend="fsdp") is None


def test_slow_bf16_cpu_takes_the_fp32_path_for_every_auto_choice(no_probe):
    for compile in (False, True):
        got = cpu_choices.resolve(FSDPConfig(compile=compile), "cpu", True, SLOW)
        assert (got.kernels, got.attention_forward, got.attention_backward) == (False, "fp32", "fp32")
        assert got.compile_scope == "mlp_norms" and got.bf16_slow
    # the same options on a fast CPU: rlweave kernels, bf16 forward, compiled bf16 backward
    fast = cpu_choices.resolve(FSDPConfig(compile=True), "cpu", True, FAST)
    assert (fast.kernels, fast.attention_forward, fast.attention_backward) == (True, "input", "bf16")


def test_slow_bf16_cpu_keeps_explicit_choices(no_probe):
    got = cpu_choices.resolve(FSDPConfig(cpu={"kernels": "rlweave"}, compile=True), "cpu", True, SLOW)
    assert got.kernels and got.attention_backward == "fp32" and got.attention_forward == "fp32"
    got = cpu_choices.resolve(FSDPConfig(cpu={"attention_backward": "bf16"}), "cpu", True, SLOW)
    # the bf16 backward recomputes from the bf16 forward
    assert got.attention_backward == "bf16" and got.attention_forward == "input"
    msg = cpu_choices.warning(got, FSDPConfig(cpu={"attention_backward": "bf16"}), "bfloat16", "ref", 1, backend="fsdp")
    assert "cpu.attention_backward: bf16 assume fast bf16" in msg and "model.dtype: bfloat16" in msg


def test_fp32_compute_and_gpu_ranks_never_probe(no_probe):
    for device, bf16 in (("cpu", False), ("cuda", True), ("cuda", False)):
        got = cpu_choices.resolve(FSDPConfig(), device, bf16)
        assert got.speed is None and not got.kernels and got.attention_forward == "input"
        assert cpu_choices.role_bf16_speed(device, bf16, 2) is None


def test_cpu_bf16_without_injection_probes(monkeypatch):
    monkeypatch.setattr(cpu_choices, "bf16_speed", lambda: SLOW)
    assert cpu_choices.resolve(FSDPConfig(), "cpu", True).speed is SLOW


def test_warning_names_the_slowdown_what_asked_for_bf16_and_the_fix():
    cfg = FSDPConfig(mixed_precision="bf16")
    msg = cpu_choices.warning(cpu_choices.resolve(cfg, "cpu", True, SLOW), cfg, "float32", "policy", 0, backend="fsdp")
    assert msg.startswith("fsdp backend: role policy rank 0 computes in bf16 on CPU (mixed_precision: bf16)")
    assert "run 97x slower than fp32 on this CPU (AVX2, no bf16 kernels in oneDNN)" in msg
    assert "use mixed_precision: none and model.dtype: float32" in msg and "assume fast bf16" not in msg
    assert cpu_choices.warning(cpu_choices.resolve(cfg, "cpu", True, FAST), cfg, "float32", "policy", 0, backend="fsdp") is None


@pytest.mark.parametrize("mask_prefix", [0, 8])
def test_cpu_attention_fp32_forward_attends_bf16_inputs_in_fp32(mask_prefix):
    """``Modes(forward="fp32")``: bf16 inputs give fp32 attention of the same values, rounded to
    bf16 once, and bf16 gradients equal to the fp32 ones rounded."""
    from rlweave.backend_helpers.hf_model.attention import _attend
    from rlweave.backend_helpers.hf_model.cpu.attention import Modes

    torch.manual_seed(0)
    g, n, h, hk, d = 3, 24, 4, 2, 16
    s = mask_prefix + n
    q = torch.randn(g, h, n, d).bfloat16().requires_grad_()
    k, v = (torch.randn(g, hk, s, d).bfloat16().requires_grad_() for _ in range(2))
    mask = None if mask_prefix == 0 else torch.ones(n, s, dtype=torch.bool).tril(mask_prefix)
    out = _attend(q, k, v, mask, None, 0.0, True, Modes(forward="fp32", backward="fp32"))
    w = torch.randn(out.shape).bfloat16().float()  # representable in bf16: the same incoming gradient both ways
    (out.float() * w).sum().backward()
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = _attend(qf, kf, vf, mask, None, 0.0, True)
    (ref * w).sum().backward()
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref.detach().bfloat16())
    for a, b in ((q.grad, qf.grad), (k.grad, kf.grad), (v.grad, vf.grad)):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b.bfloat16())
    # the default forward runs in bf16: not the same numbers
    assert not torch.equal(_attend(q, k, v, mask, None, 0.0, True), out)


def test_cpu_attention_modes_reject_unknown_kinds():
    from rlweave.backend_helpers.hf_model.cpu.attention import Modes

    with pytest.raises(ValueError, match="input or fp32"):
        Modes(forward="bf16")
    with pytest.raises(ValueError, match="fp32 or bf16"):
        Modes(backward="fp16")


def test_cpu_options_are_nested_and_strict():
    """``options.cpu`` is its own section: unknown keys in it and flat keys beside it (``cpu_kernels``, ...) are errors."""
    from pydantic import ValidationError

    assert FSDPConfig().cpu.kernels == "auto" and FSDPConfig().cpu.attention_backward == "auto"
    for bad in ({"cpu": {"kernel": "torch"}}, {"cpu_kernels": "torch"}, {"cpu_attention_backward": "fp32"}):
        with pytest.raises(ValidationError):
            FSDPConfig.model_validate(bad)


def test_workers_of_a_role_resolve_with_the_slowest_ranks_speed_and_warn_once(tmp_path):
    """Two ranks, bf16 mixed precision on CPU, rank 0 injected fast and rank 1 slow: both take
    the fp32 paths (no rlweave kernels, attention fp32 forward and backward), rank 0 logs one
    warning naming the slowdown, and training works."""
    from rlweave.testing.helper_modules import import_helper
    from rlweave.testing.ranks import run_ranks
    from rlweave.testing.tiny_model import build_tiny_qwen2

    sc = import_helper(Path(__file__).with_name("fsdp_scenarios.py"))

    tiny = str(build_tiny_qwen2(tmp_path / "model", seed=1))
    ranks = run_ranks(sc.cpu_choices_scenario, 2, tiny, str(tmp_path), [0.15, 97.0], timeout_s=600)["ranks"]
    for r in ranks:
        assert r["ratio"] == 97.0
        assert r["marks"] == [("fp32", "fp32")] * 2 and r["kernels"] == [False, False]
        assert math.isfinite(r["losses"][0]) and r["losses"][1] < r["losses"][0]
    assert len(ranks[0]["logged"]) == 1 and ranks[1]["logged"] == []
    assert "run 97x slower than fp32 on this CPU" in ranks[0]["logged"][0]
