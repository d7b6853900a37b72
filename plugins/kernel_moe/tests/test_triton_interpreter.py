"""The Triton kernels' indexing checked on CPU by Triton's interpreter (``TRITON_INTERPRET=1``):
fp32 and fp16 forward and backward against the reference, with experts without tokens and
shapes that are no multiple of the block sizes. Skipped where triton is not installed (it is
optional); on a GPU, ``test_triton_gpu.py`` runs the compiled kernels."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

PROBLEMS = Path(__file__).with_name("experts_problems.py")
SCRIPT = r"""
import json, sys, torch
from rlweave.testing.helper_modules import import_helper
from rlweave_kernel_moe import experts
_problems = import_helper(sys.argv[1])
forward_backward, make_problem, max_diff = _problems.forward_backward, _problems.make_problem, _problems.max_diff

def run(impl):
    return lambda p: experts.grouped_experts(p.hidden, p.top_k_index, p.top_k_weights, p.gate_up, p.down,
                                             torch.nn.functional.silu, impl)
out = {}
for name, dtype, shape, grad in [("fp32 odd", torch.float32, (70, 48, 40, 8, 3, 6), "random"),
                                 ("fp32 one token", torch.float32, (1, 40, 24, 5, 1, 5), "sum"),
                                 ("fp32 over blocks", torch.float32, (150, 100, 70, 6, 4, 5), "sum"),
                                 ("fp16", torch.float16, (50, 64, 32, 8, 2, 6), "random"),
                                 ("fp16 large tiles", torch.float16, (600, 72, 40, 2, 1, 2), "random")]:
    t, h, i, e, k, active = shape
    p = make_problem(t, h, i, e, k, active=active, uneven=True, dtype=dtype)
    got = forward_backward(run("triton"), p, grad)
    want = forward_backward(run("reference"), p, grad)
    zero = bool(got[3][active:].abs().max() == 0) if active < e else True
    out[name] = dict(max_diff(got, want), zero=zero)
out["fallbacks"] = experts.fallbacks()
print(json.dumps(out))
"""


def test_triton_kernels_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(PROBLEMS)], check=False, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result.pop("fallbacks") == {}
    for name, r in result.items():
        assert r["zero"], name
        worst = max(v for key, v in r.items() if key != "zero")
        assert worst <= (1e-2 if name.startswith("fp16") else 1e-5), (name, r)
