"""The CPU fast paths' one entry (:func:`rlweave.backend_helpers.hf_model.cpu.prepare`): what it applies
to a model, to that model alone, and that it applies nothing on CUDA."""

from __future__ import annotations

import pytest
import torch

from rlweave.backend_helpers.hf_model import cpu
from rlweave_backend_fsdp.config import FSDPConfig
from rlweave.backend_helpers.hf_model.cpu import attention, rotary

QWEN2 = "transformers.models.qwen2.modeling_qwen2"


@pytest.fixture(autouse=True)
def fresh_routing(monkeypatch):
    import transformers.models.qwen2.modeling_qwen2 as mq

    monkeypatch.setattr(mq, "apply_rotary_pos_emb", rotary.original(QWEN2) or mq.apply_rotary_pos_emb)
    monkeypatch.setattr(rotary, "_ORIGINALS", {})


def _tiny(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1))


def _patched_linears(model) -> int:
    return sum("forward" in m.__dict__ for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_two_models_in_one_process_keep_their_own_choices():
    policy, reference = _tiny(0), _tiny(1)
    fast = cpu.prepare(policy, FSDPConfig(cpu={"kernels": "rlweave"}, compile=True), "cpu", False, 1, backend="fsdp")
    plain = cpu.prepare(reference, FSDPConfig(cpu={"kernels": "torch"}), "cpu", False, 1, backend="fsdp")
    assert (fast.kernels, fast.attention_backward, fast.compiled_logprobs) == (True, "bf16", True)
    assert (plain.kernels, plain.attention_backward, plain.compiled_logprobs) == (False, "fp32", False)
    assert _patched_linears(policy) == 2 * 3 + 1 and _patched_linears(reference) == 0  # MLPs and the LM head
    assert [attention.modes_of(layer.self_attn).backward for layer in policy.model.layers] == ["bf16"] * 2
    assert [attention.modes_of(layer.self_attn) for layer in reference.model.layers] == [attention.Modes()] * 2
    seen = []
    for model in (policy, reference):
        model.model.layers[1].self_attn.register_forward_hook(lambda m, a, o: seen.append(rotary.active()))
        model(input_ids=torch.arange(6)[None])
    assert seen == [rotary.Rotary(compiled=True), None]  # the reference runs transformers' rotary


def test_cuda_ranks_get_their_choices_and_an_untouched_model():
    model = _tiny(0)
    got = cpu.prepare(model, FSDPConfig(cpu={"kernels": "rlweave"}), "cuda", True, 1, backend="fsdp")
    assert got.compile_scope == "layer" and got.speed is None and not got.compiled_logprobs
    assert _patched_linears(model) == 0 and rotary.original(QWEN2) is None
    assert attention.modes_of(model.model.layers[0].self_attn) is attention.DEFAULT
