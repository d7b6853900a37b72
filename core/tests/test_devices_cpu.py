"""rlweave.devices.cpu: the bf16 speed probe (real measurement, override, cache, light import)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rlweave.devices import cpu


def test_real_probe_measures_a_sane_ratio_quickly_and_restores_threads():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    s = cpu.measure()
    took = time.perf_counter() - t0
    assert s.source == "measured" and isinstance(s.capability, str) and s.capability
    assert 1e-3 < s.ratio < 1e4, s
    assert took < 3.0, f"probe took {took:.2f} s"
    assert torch.get_num_threads() == threads
    assert s.slow == (s.ratio >= cpu.SLOW_RATIO), s  # judged by what was measured, not by the CPU's name:
    # without oneDNN bf16 kernels some CPUs run bf16 ~100x slower, others (torch 2.13 on an AVX2-only AMD
    # EPYC) about as fast as fp32
    d = s.describe()
    assert d.startswith("bf16 matmuls (a linear layer's forward and backward) run ") and f"({s.capability}" in d


def test_probe_runs_once_per_process(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.delenv(cpu.ENV, raising=False)
    cpu._measured_once.cache_clear()
    first = cpu.bf16_speed()
    t0 = time.perf_counter()
    assert cpu.bf16_speed() is first
    assert time.perf_counter() - t0 < 0.01


@pytest.mark.parametrize("raw, slow, phrase", [("97", True, "97x slower than fp32"), ("0.2", False, "5.0x faster than"),
                                               ("2", True, "2.0x as slow as"), ("1.5", False, "1.5x as slow as")])
def test_environment_variable_replaces_the_measurement(monkeypatch, raw, slow, phrase):
    pytest.importorskip("torch")
    monkeypatch.setenv(cpu.ENV, raw)
    s = cpu.bf16_speed()
    assert s.ratio == float(raw) and s.slow is slow and s.source == cpu.ENV
    assert phrase in s.describe() and cpu.ENV in s.describe()


@pytest.mark.parametrize("raw", ["fast", "0", "-3", "inf", "nan"])
def test_a_bad_environment_variable_is_an_error_naming_it(monkeypatch, raw):
    monkeypatch.setenv(cpu.ENV, raw)
    with pytest.raises(ValueError, match=cpu.ENV):
        cpu.bf16_speed()


def test_threshold_is_explicit():
    assert not cpu.Bf16Speed(ratio=cpu.SLOW_RATIO * 0.99).slow
    assert cpu.Bf16Speed(ratio=cpu.SLOW_RATIO).slow
    d = cpu.Bf16Speed(ratio=97.0, capability="AVX2", onednn_bf16=False, source="measured").describe()
    assert d == ("bf16 matmuls (a linear layer's forward and backward) run 97x slower than fp32 on this CPU "
                 "(AVX2, no bf16 kernels in oneDNN)")


def test_importing_the_probe_module_imports_no_torch():
    code = "import sys, rlweave.devices.cpu; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_engines_get_a_warning_only_for_bf16_on_a_slow_cpu(monkeypatch):
    from rlweave.devices.cpu import ENV, slow_bf16_warning

    monkeypatch.setenv(ENV, "50")
    msg = slow_bf16_warning("role rollout rank 0 (vllm engine)", "torch.bfloat16", "cpu")
    assert msg is not None and msg.startswith("role rollout rank 0 (vllm engine) computes in bf16 on CPU")
    assert "50x slower than fp32" in msg and "use dtype float32" in msg
    assert slow_bf16_warning("x", "float32", "cpu") is None
    assert slow_bf16_warning("x", "bfloat16", "cuda") is None
    monkeypatch.setenv(ENV, "0.5")
    assert slow_bf16_warning("x", "bfloat16", "cpu") is None
