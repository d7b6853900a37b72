"""The CPU redirections of megatron-core (:mod:`rlweave_backend_megatron.cpu_shim`): installed once,
removed exactly, a CPU-seeded RNG tracker whose forked stream is reproducible and leaves the
default stream alone, a CPU global memory buffer, and nothing applied by merely importing the
worker."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from rlweave_backend_megatron import cpu_shim


def _targets() -> dict[str, object]:
    """The five class attributes and two module-level ``torch`` names the shim replaces, as currently installed."""
    from megatron.core import utils
    from megatron.core.models.common.embeddings import rotary_pos_embedding as rope
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.tensor_parallel import layers, mappings
    from megatron.core.tensor_parallel import random as mrandom

    return {"setup_embeddings": LanguageModule.__dict__["setup_embeddings_and_output_layer"],
            "get_emb": rope.RotaryEmbedding.__dict__["get_emb"],
            "get_tensor": utils.GlobalMemoryBuffer.__dict__["get_tensor"],
            "add": mrandom.CudaRNGStatesTracker.__dict__["add"],
            "fork": mrandom.CudaRNGStatesTracker.__dict__["fork"],
            "layers_torch": layers.torch, "mappings_torch": mappings.torch}


@pytest.fixture
def shim():
    """The shim applied for one test, always removed afterwards (and the CPU RNG state put back)."""
    if cpu_shim.applied():  # left over by someone else: start from megatron's own methods
        cpu_shim.restore()
    original = _targets()
    rng = torch.get_rng_state()
    cpu_shim.apply()
    try:
        yield original
    finally:
        cpu_shim.restore()
        torch.set_rng_state(rng)  # the tests reseed the default CPU stream


def test_apply_is_idempotent_and_restore_gives_back_the_originals(shim):
    original = shim
    assert cpu_shim.applied()
    installed = _targets()
    assert all(installed[k] is not original[k] for k in original), "every target is replaced"
    cpu_shim.apply()  # a second apply changes nothing (and must not save the shim as the original)
    assert _targets() == installed
    cpu_shim.restore()
    assert not cpu_shim.applied()
    assert all(_targets()[k] is original[k] for k in original)
    cpu_shim.restore()  # restoring twice is harmless
    assert all(_targets()[k] is original[k] for k in original)


def test_rng_tracker_forks_a_seeded_cpu_stream(shim):
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    def draws(seed_default: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        torch.manual_seed(seed_default)
        tracker = CudaRNGStatesTracker()
        tracker.add("a", 1)
        before = torch.get_rng_state()
        with tracker.fork("a"):
            first = torch.rand(5)
        assert torch.equal(torch.get_rng_state(), before), "fork must leave the default CPU stream as it was"
        with tracker.fork("a"):  # the named stream continues where it stopped
            second = torch.rand(5)
        default = torch.rand(5)
        return first, second, default, before

    f1, s1, d1, _ = draws(123)
    f2, s2, _, _ = draws(999)  # a different default seed: the forked stream does not depend on it
    assert torch.equal(f1, f2) and torch.equal(s1, s2)
    assert not torch.equal(f1, s1)
    assert torch.equal(f1, torch.rand(5, generator=torch.Generator().manual_seed(1)))
    torch.manual_seed(123)
    assert torch.equal(d1, torch.rand(5)), "the default stream draws as if no fork had happened"
    assert not torch.equal(f1, d1)

    tracker = CudaRNGStatesTracker()
    tracker.add("a", 1)
    with pytest.raises(Exception, match="already exists"):
        tracker.add("b", 1)
    with pytest.raises(Exception, match="already exists"):
        tracker.add("a", 2)
    with pytest.raises(Exception, match="not added"), tracker.fork("c"):
        pass
    # the state is restored when the forked region raises
    state = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="boom"), tracker.fork("a"):
        torch.rand(3)
        raise RuntimeError("boom")
    assert torch.equal(torch.get_rng_state(), state)


def test_rng_tracker_streams_per_name_and_seed(shim):
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    tracker = CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", 7)
    tracker.add("other", 8)
    with tracker.fork():  # megatron's default name
        a = torch.rand(4)
    with tracker.fork("other"):
        b = torch.rand(4)
    assert torch.equal(a, torch.rand(4, generator=torch.Generator().manual_seed(7)))
    assert torch.equal(b, torch.rand(4, generator=torch.Generator().manual_seed(8)))
    assert tracker.is_initialized()



def test_rng_tracker_nested_fork_of_the_same_name_continues_the_stream(shim):
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    tracker = CudaRNGStatesTracker()
    tracker.add("a", 1)
    with tracker.fork("a"):
        outer = torch.rand(4)
        with tracker.fork("a"):
            inner = torch.rand(4)
    expected = torch.rand(8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.cat([outer, inner]), expected)


def test_activation_recompute_runs_on_cpu(shim):
    from megatron.core import tensor_parallel

    x = torch.randn(3, 4, requires_grad=True)
    out = tensor_parallel.checkpoint(lambda t: (t.sin() * 2).sum(), False, x)
    out.backward()
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())

def test_global_memory_buffer_is_on_cpu_and_reused(shim):
    from megatron.core.utils import GlobalMemoryBuffer

    buf = GlobalMemoryBuffer()
    t = buf.get_tensor((3, 4), torch.float32, "mpu")
    assert t.device.type == "cpu" and t.shape == (3, 4) and t.dtype == torch.float32
    small = buf.get_tensor([2, 5], torch.float32, "mpu")  # fits: same storage
    assert small.shape == (2, 5) and small.data_ptr() == t.data_ptr()
    big = buf.get_tensor((5, 5), torch.float32, "mpu")  # larger: a new buffer, then reused
    assert big.shape == (5, 5) and big.numel() == 25
    assert buf.get_tensor((4, 6), torch.float32, "mpu").data_ptr() == big.data_ptr()
    other = buf.get_tensor((3, 4), torch.bfloat16, "mpu")  # per (name, dtype)
    assert other.dtype == torch.bfloat16 and other.data_ptr() != big.data_ptr()
    assert buf.get_tensor((3, 4), torch.float32, "other").data_ptr() != big.data_ptr()
    assert buf.get_tensor((2, 2), torch.float32, "mpu", mem_alloc_context=None).device.type == "cpu"


def test_rotary_embedding_stays_on_cpu(shim):
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    rope = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, rotary_base=10000, use_cpu_initialization=True)
    emb = rope.get_emb(6)
    assert emb.device.type == "cpu" and emb.shape == (6, 1, 1, 8)
    pos = torch.arange(6, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    freqs = torch.outer(pos, inv)
    torch.testing.assert_close(emb[:, 0, 0], torch.cat([freqs, freqs], dim=-1))


_IMPORT_THEN_INIT = r"""
import json, sys
from rlweave_backend_megatron import cpu_shim
import rlweave_backend_megatron.worker  # noqa: F401
from megatron.core.utils import GlobalMemoryBuffer
after_import = cpu_shim.applied() or GlobalMemoryBuffer.get_tensor.__module__ != "megatron.core.utils"
from rlweave.testing.ranks import free_port
from rlweave.testing.scenarios import train_worker
w = train_worker("megatron", {"rank": 0, "world_size": 1, "master_port": free_port(), "device": "cpu"},
                 {"path": sys.argv[1], "dtype": "float32"}, None, {"tp": 1, "pp": 1})
after_init = cpu_shim.applied() and GlobalMemoryBuffer.get_tensor.__module__ == "rlweave_backend_megatron.cpu_shim"
w.shutdown()
print(json.dumps({"after_import": after_import, "after_init": after_init}))
"""


def test_importing_the_worker_does_not_apply_the_shim_but_a_cpu_init_model_does(tmp_path):
    from rlweave.testing.tiny_model import build_tiny_qwen2

    path = build_tiny_qwen2(tmp_path / "m", vocab_size=64, hidden=32, layers=1, heads=4, kv_heads=2, ffn=32)
    out = subprocess.run([sys.executable, "-c", _IMPORT_THEN_INIT, str(path)], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"after_import": False, "after_init": True}


def test_sequence_parallel_collectives_allocate_on_cpu(shim):
    """The tensor-parallel modules' gathers allocate on the CPU (one process, a group of one
    rank is bypassed by megatron, so the allocation is checked directly)."""
    import torch
    from megatron.core.tensor_parallel import mappings

    assert mappings.torch.cuda.current_device() == torch.device("cpu")
    assert mappings.torch.empty(2, device=mappings.torch.cuda.current_device()).device.type == "cpu"
    assert mappings.torch.float32 is torch.float32 and mappings.torch.distributed is torch.distributed
