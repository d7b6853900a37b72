"""On a CUDA GPU: the own Triton grouped GEMM and torch's grouped_mm against the per-expert
reference, forward and backward (hidden states, routing weights, both weight tensors).

fp32 runs with TF32 off (IEEE products) and must agree tightly; bf16/fp16 must be about as
close to an fp32 computation on the same inputs as the reference loop in that dtype is.
Cases cover experts without tokens, uneven expert sizes, top-8, one token, a zero-stride
incoming gradient and shapes that are no multiple of the block sizes. Imports the modules
directly (no plugin manager), so it runs with ``PYTHONPATH=plugins/kernel_moe/src:core/src``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from rlweave.testing.helper_modules import import_helper
from rlweave_kernel_moe import experts, torch_grouped
from rlweave_kernel_moe.kernel import KERNEL

_problems = import_helper(Path(__file__).with_name("experts_problems.py"))
Problem, forward_backward, make_problem, max_diff = (_problems.Problem, _problems.forward_backward,
                                                     _problems.make_problem, _problems.max_diff)

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")

SHAPES = {
    # name: (tokens, hidden, intermediate, experts, top_k, active experts, uneven)
    "odd sizes, 4 experts without tokens": (300, 200, 150, 16, 8, 12, True),
    "one token, top-8": (1, 64, 32, 8, 8, 8, False),
    "64 experts, uneven": (2048, 512, 256, 64, 8, 60, True),
    "128 experts, few tokens each": (513, 96, 80, 128, 8, 128, True),
    "wide": (1024, 1024, 384, 32, 4, 30, True),
}


@pytest.fixture(autouse=True)
def no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def run(impl):
    def fn(p: Problem) -> torch.Tensor:
        return experts.grouped_experts(p.hidden, p.top_k_index, p.top_k_weights, p.gate_up, p.down,
                                       torch.nn.functional.silu, impl)
    return fn


def upcast(p: Problem) -> Problem:
    def leaf(t):
        return t.detach().float().requires_grad_()
    return Problem(leaf(p.hidden), p.top_k_index, leaf(p.top_k_weights), leaf(p.gate_up), leaf(p.down))


def check(impl: str, name: str, dtype: torch.dtype, grad: str) -> dict:
    tokens, hidden, inter, n_exp, top_k, active, uneven = SHAPES[name]
    p = make_problem(tokens, hidden, inter, n_exp, top_k, active=active, uneven=uneven, dtype=dtype,
                     device="cuda", seed=tokens)
    before = experts.fallbacks()
    got = forward_backward(run(impl), p, grad)
    assert experts.fallbacks() == before, f"{impl} fell back to the reference: {experts.fallbacks()}"
    assert got[0].dtype == dtype
    if dtype == torch.float32:
        diffs = max_diff(got, forward_backward(run("reference"), p, grad))
        assert max(diffs.values()) <= 2e-5, diffs
    else:
        exact = forward_backward(run("reference"), upcast(p), grad)
        diffs = max_diff(got, exact)
        ref_diffs = max_diff(forward_backward(run("reference"), p, grad), exact)
        for key in diffs:
            assert diffs[key] <= 2 * ref_diffs[key] + 2e-3 and diffs[key] < 5e-2, (key, diffs, ref_diffs)
    if active < n_exp:  # no tokens: exactly zero weight gradients
        assert got[3][active:].abs().max() == 0 and got[4][active:].abs().max() == 0
    return diffs


@needs_triton
@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_triton_matches_reference(name, dtype):
    check("triton", name, dtype, "random")


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_zero_stride_gradient(dtype):
    check("triton", "odd sizes, 4 experts without tokens", dtype, "sum")


@needs_triton
def test_triton_tile_map_never_mixes_experts():
    from rlweave_kernel_moe.triton_grouped import tile_map

    offsets = torch.tensor([0, 5, 5, 200, 201, 201], dtype=torch.int32, device="cuda")
    tile_expert, tile_row = tile_map(offsets, 201, 64)
    assert tile_expert.tolist() == [1, 3, 3, 3, 3, 4] + [-1] * 4
    assert tile_row.tolist()[:6] == [0, 5, 69, 133, 197, 200]


@pytest.mark.parametrize("name", ["odd sizes, 4 experts without tokens", "64 experts, uneven", "wide"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_torch_grouped_matches_reference_on_cuda(name, dtype):
    why = torch_grouped.device_problem("cuda", dtype)
    if why:
        pytest.skip(why)
    _, hidden, inter, *_ = SHAPES[name]
    if torch_grouped.layout_problem(hidden, inter, dtype):
        name = "64 experts, uneven"  # 16-byte aligned rows
    check("torch", name, dtype, "random")
    check("torch", name, dtype, "sum")


def test_implementation_on_cuda():
    impl = KERNEL.implementation("cuda")
    if torch_grouped.device_problem("cuda", torch.bfloat16) is None:
        assert impl == "torch"
    elif importlib.util.find_spec("triton") is not None and torch.cuda.get_device_capability()[0] >= 8:
        assert impl == "triton"
    else:
        assert impl == "reference"


@needs_triton
def test_apply_on_a_tiny_qwen3_moe_matches_eager():
    import copy

    import transformers

    cfg = transformers.Qwen3MoeConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, moe_intermediate_size=48, num_experts=32,
                                      num_experts_per_tok=4, intermediate_size=64, tie_word_embeddings=False)
    cfg._experts_implementation = "eager"
    torch.manual_seed(0)
    eager = transformers.Qwen3MoeForCausalLM(cfg).float().cuda()
    ours = copy.deepcopy(eager)
    assert KERNEL.apply(ours, device="cuda", impl="triton")["replaced"] == 2
    ids = torch.randint(0, 96, (2, 33), device="cuda")
    outs = []
    for model in (eager, ours):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        outs.append((out.logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    assert (outs[0][0] - outs[1][0]).abs().max() <= 1e-4
    for n, g in outs[0][1].items():
        assert (outs[1][1][n] - g).abs().max() <= 1e-4 * max(1.0, g.abs().max().item()), n
