"""Light parts of the FSDP backend: plugin record, config, micro-batch plan, LR schedule."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest


def test_plugin_record_and_light_import():
    code = (
        "import sys; from rlweave_backend_fsdp.plugin import rlweave_training_backends as h; "
        "r = h()[0]; assert r.name == 'fsdp' and r.target.endswith(':FSDPWorker'); "
        "print('torch' in sys.modules, r.config_model().use_packing)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_config_is_strict():
    from pydantic import ValidationError

    from rlweave_backend_fsdp.config import FSDPConfig

    assert FSDPConfig(mixed_precision="bf16").mixed_precision == "bf16"
    with pytest.raises(ValidationError):
        FSDPConfig(mixed_precison="bf16")
    with pytest.raises(ValidationError):
        FSDPConfig(max_tokens_per_micro_batch=0)


def test_micro_batch_plan_respects_budget_and_covers_all():
    from rlweave.backend_helpers.hf_model.micro import plan

    lens = [5, 17, 9, 30, 3, 12, 40, 1]
    groups = plan(lens, 32)
    assert sorted(i for g in groups for i in g) == list(range(len(lens)))
    for g in groups:
        assert sum(lens[i] for i in g) <= 32 or len(g) == 1
    assert len(groups) == 4  # 40 alone; the other 77 tokens fit in 3 bins of 32 (first-fit decreasing)
    assert plan([], 8) == []


def test_schedule_warmup_cosine_constant():
    from rlweave.backend_helpers.schedule import WarmupSchedule

    s = WarmupSchedule(warmup_steps=2, schedule="cosine", total_steps=12, min_lr_ratio=0.1)
    assert [s(0), s(1)] == [0.5, 1.0]
    assert s(2) == pytest.approx(1.0) and s(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert s(12) == pytest.approx(0.1) and s(100) == pytest.approx(0.1)
    assert WarmupSchedule(schedule="constant")(50) == 1.0
    with pytest.raises(ValueError, match="total_steps"):
        WarmupSchedule(schedule="cosine")


@pytest.mark.parametrize("dtype,backward", [("float32", "fp32"), ("float32", "bf16"), ("bfloat16", "fp32"),
                                            ("bfloat16", "bf16")])
def test_grouped_varlen_attention_equals_per_sample(dtype, backward, monkeypatch):
    """Equal-length samples are stacked into one SDPA call; outputs and gradients must equal
    causal attention of each sample on its own (mixed lengths, repeats, unsorted order). The
    bf16 backward's math runs eagerly here; compiled, it is checked in the process that compiles
    it for training (``test_bf16_compiled_attention_backward_trains_like_fp32_backward``)."""
    import torch
    import torch.nn.functional as F

    from rlweave.backend_helpers.hf_model import inductor
    from rlweave.backend_helpers.hf_model.attention import packed_plan, planned_sdpa
    from rlweave.backend_helpers.hf_model.cpu.attention import Modes

    monkeypatch.setattr(inductor, "compiled", lambda fn: fn)

    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    lens = [5, 3, 5, 7, 3, 5, 1]
    bounds = [0]
    for n in lens:
        bounds.append(bounds[-1] + n)
    q = torch.randn(1, 4, bounds[-1], 8, dtype=dt, requires_grad=True)
    k = torch.randn(1, 2, bounds[-1], 8, dtype=dt, requires_grad=True)
    v = torch.randn(1, 2, bounds[-1], 8, dtype=dt, requires_grad=True)
    w = torch.randn(1, bounds[-1], 4, 8)

    got = planned_sdpa(q, k, v, packed_plan(tuple(bounds)), None, 0.0, True, Modes(backward=backward))
    (got.float() * w).sum().backward()
    g_got = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    ref = torch.cat([
        F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True, enable_gqa=True)
        for s, e in zip(bounds[:-1], bounds[1:])
    ], dim=2).transpose(1, 2)
    (ref.float() * w).sum().backward()
    tol, rtol = (1e-6, 0) if dtype == "float32" else (2e-2, 2e-2)  # bf16: one rounding step of values up to ~8
    assert got.shape == ref.shape == (1, bounds[-1], 4, 8)
    assert torch.allclose(got.float(), ref.float(), atol=tol, rtol=rtol)
    for a, b in zip(g_got, (q.grad, k.grad, v.grad)):
        assert torch.allclose(a.float(), b.float(), atol=tol, rtol=rtol)


@pytest.mark.parametrize("dtype,backward", [("float32", "fp32"), ("bfloat16", "fp32"), ("bfloat16", "bf16")])
def test_shared_prompt_attention_equals_unshared(dtype, backward, monkeypatch):
    """A row carrying each group's prompt once must give every original token the attention
    output it has in its own unshared sample, and the same gradients (a shared prompt token
    gets the sum over its samples). Mixed prompt and response lengths, a group of one, an
    empty response. The bf16 backward's math runs eagerly here; compiled, the same case is
    checked in the process that compiles it for training
    (``test_bf16_compiled_attention_backward_trains_like_fp32_backward``)."""
    import torch

    from rlweave.testing.helper_modules import import_helper
    from rlweave.backend_helpers.hf_model import inductor

    monkeypatch.setattr(inductor, "compiled", lambda fn: fn)
    sc = import_helper(Path(__file__).with_name("fsdp_scenarios.py"))
    case = sc.shared_prompt_attention(dtype, backward)
    row, ids = case["row"], case["ids"]
    assert row is not None and row.input_ids.numel() == 3 + 2 + 4 + (3 + 3 + 1) + (1 + 4) + 2
    assert torch.equal(row.input_ids[row.tok_row], ids)  # every token maps to its own id
    # laid out in bucket order: every bucket's queries are one slice of the row, no scatter back
    assert row.plan.inv is None and all(isinstance(b.q_idx, tuple) for b in row.plan.buckets)
    assert any(b.mask is not None for b in row.plan.buckets)  # prefix buckets: responses see their prompt only
    assert case["got"].shape == case["ref"].shape == (1, ids.numel(), 4, 8)
    assert sc.shared_prompt_attention_close(case, dtype)


@pytest.mark.parametrize("prefix", [0, 24])
def test_cpu_bf16_attention_backward_matches_fp64(prefix):
    """The bf16 CPU backward (``Modes(backward="bf16")``) against fp64 attention on
    the same bf16 inputs: gradients within bf16 rounding (relative error ~4e-3 measured),
    for causal buckets and prefix buckets, with grouped key/value heads."""
    import torch

    from rlweave.backend_helpers.hf_model.cpu.attention import _CPUFlash

    torch.manual_seed(0)
    g, n, h, hk, d = 6, 40, 4, 2, 32
    s = prefix + n
    q = torch.randn(g, h, n, d).bfloat16().requires_grad_()
    k = torch.randn(g, hk, s, d).bfloat16().requires_grad_()
    v = torch.randn(g, hk, s, d).bfloat16().requires_grad_()
    w = torch.randn(g, h, n, d)
    allowed = torch.ones(n, s, dtype=torch.bool).tril(prefix)
    mask = None if prefix == 0 else torch.zeros(n, s).masked_fill_(~allowed, float("-inf"))
    got = _CPUFlash.apply(q, k, v, mask, d ** -0.5, "bf16")
    (got.float() * w).sum().backward()
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    sc = (qd @ kd.repeat_interleave(h // hk, 1).transpose(-1, -2)) * d ** -0.5
    ref = torch.softmax(sc.masked_fill(~allowed, float("-inf")), -1) @ vd.repeat_interleave(h // hk, 1)
    (ref * w.double()).sum().backward()
    for a, b in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert a.dtype == torch.bfloat16 and a.shape == b.shape
        err = float((a.double() - b).norm() / b.norm())
        assert err < 1.5e-2, err


def test_shared_prompt_micro_batches_keep_groups_together():
    import torch

    from rlweave.backend_helpers.hf_model.prefix import plan_units, share

    # 3 groups of 4 samples: prompt 4 tokens, responses 6 -> a group costs 4 + 4*6 = 28 shared tokens
    seqs = [[10 + g] * 4 + [1] * 6 for g in range(3) for _ in range(4)]
    cu = torch.tensor([0] + [10 * (i + 1) for i in range(12)])
    ids = torch.tensor([t for x in seqs for t in x])
    plens = [4] * 12
    assert plan_units(ids, cu, plens, 56) == [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11]]
    # a group over the budget is cut, each part carrying the prompt: 4 + 6 + 6 = 16
    assert plan_units(ids, cu, plens, 16) == [[i, i + 1] for i in range(0, 12, 2)]
    # nothing shared: the plain token-budget plan, and no shared row
    distinct = torch.tensor([t for g in range(12) for t in [g] * 4 + [1] * 6])
    assert plan_units(distinct, cu, plens, 30) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert share(distinct, cu, plens) is None
