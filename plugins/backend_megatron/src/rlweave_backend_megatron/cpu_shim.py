"""The redirections that let megatron-core's dense GPT layers run on a CPU process (gloo).

megatron-core targets CUDA: these calls hard-code it on paths a dense model takes.

- ``GlobalMemoryBuffer.get_tensor`` allocates its scratch buffers on
  ``torch.cuda.current_device()``; on CPU they are allocated on the CPU.
- ``RotaryEmbedding.get_emb`` moves its inverse frequencies to ``torch.cuda.current_device()``
  on the first call; on CPU they stay where they are.
- ``LanguageModule.setup_embeddings_and_output_layer`` moves a pipeline's tied output weight
  to CUDA before summing it over the embedding group; on CPU, ``Tensor.cuda`` is the identity
  for the length of that one call.
- ``CudaRNGStatesTracker`` keeps named CUDA generator states (the tensor-parallel dropout
  stream) and swaps them in with ``fork()``; on CPU its ``add``/``fork`` keep and swap named
  states of the CPU generator instead, so forked regions still draw from their own
  seeded stream (different per tensor-parallel rank, as on GPU; a nested fork of the same
  name continues it).
- ``_get_cuda_rng_state`` / ``_set_cuda_rng_state`` (read and restored around each recomputed
  layer of activation checkpointing) read and set the CPU generator's state.
- The tensor-parallel communication and linear-layer modules (``tensor_parallel.mappings``,
  ``tensor_parallel.layers``) allocate the outputs of sequence-parallel gathers and
  reduce-scatters on ``torch.cuda.current_device()``; those two modules see a view of ``torch``
  whose ``cuda.current_device()`` is the CPU (everything else is torch's own).

:func:`apply` installs them all (on the classes and the random module), once per process, and only when the worker's
device is the CPU: a CUDA worker never calls it, so nothing here touches a GPU run.
:func:`restore` undoes them (tests). Attention needs an explicit mask on CPU (megatron's
default causal mask is built on CUDA); the worker always passes one.
"""

from __future__ import annotations

import contextlib
from typing import Any

_saved: dict[str, Any] = {}


def _cpu_get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
    import torch

    n = 1
    for d in tensor_shape:
        n *= int(d)
    buf = self.buffer.get((name, dtype))
    if buf is None or buf.numel() < n:
        buf = self.buffer[(name, dtype)] = torch.empty(n, dtype=dtype, device="cpu")
    return buf[:n].view(*tensor_shape)


def _cpu_get_emb(self, max_seq_len, offset=0):
    import torch

    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    if self.rotary_interleaved:
        emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
    return emb[:, None, None, :]


def _cpu_setup_embeddings(self):
    import torch

    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda t, *a, **k: t
    try:
        return _saved["setup_embeddings"](self)
    finally:
        torch.Tensor.cuda = cuda


def _cpu_add(self, name, seed):
    import torch

    if seed in self.seeds_:
        raise Exception(f"seed {seed} already exists")
    if name in self.states_:
        raise Exception(f"rng state {name} already exists")
    self._is_initialized = True
    self.seeds_.add(seed)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    self.states_[name] = gen.get_state()


@contextlib.contextmanager
def _cpu_fork(self, name="model-parallel-rng"):
    import torch

    if name not in self.states_:
        raise Exception(f"rng state {name} is not added")
    outer = getattr(self, "_current_state_name", "default-rng")
    orig = torch.get_rng_state()
    if outer != "default-rng":  # the enclosing fork's stream, as it stands now
        self.states_[outer] = orig
    torch.set_rng_state(self.states_[name])
    self._current_state_name = name
    try:
        yield
    finally:
        self.states_[name] = torch.get_rng_state()
        self._current_state_name = outer
        torch.set_rng_state(self.states_[outer] if outer != "default-rng" else orig)


def _cpu_get_state(device="cuda", clone=False, graph_safe=False):
    import torch

    return torch.get_rng_state()


def _cpu_set_state(new_state, device=-1, graph_safe=False):
    import torch

    torch.set_rng_state(new_state)


class _CudaOnCpu:
    """``torch.cuda`` as the two tensor-parallel modules see it: ``current_device()`` is the CPU."""

    @staticmethod
    def current_device():
        import torch

        return torch.device("cpu")

    def __getattr__(self, name):
        import torch

        return getattr(torch.cuda, name)


class _TorchOnCpu:
    """``torch`` as the two tensor-parallel modules see it (:class:`_CudaOnCpu` as ``cuda``)."""

    cuda = _CudaOnCpu()

    def __getattr__(self, name):
        import torch

        return getattr(torch, name)


def applied() -> bool:
    """Whether the CPU redirections are installed in this process."""
    return bool(_saved)


def apply() -> None:
    """Install the CPU redirections (idempotent). Call only in a process whose model runs on the CPU."""
    if _saved:
        return
    from megatron.core import utils
    from megatron.core.models.common.embeddings import rotary_pos_embedding as rope
    from megatron.core.tensor_parallel import random as mrandom

    from megatron.core.models.common.language_module.language_module import LanguageModule

    _saved["setup_embeddings"] = LanguageModule.setup_embeddings_and_output_layer
    LanguageModule.setup_embeddings_and_output_layer = _cpu_setup_embeddings
    _saved["get_emb"] = rope.RotaryEmbedding.get_emb
    rope.RotaryEmbedding.get_emb = _cpu_get_emb
    _saved["get_tensor"] = utils.GlobalMemoryBuffer.get_tensor
    _saved["get_state"], _saved["set_state"] = mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state
    mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state = _cpu_get_state, _cpu_set_state
    _saved["add"] = mrandom.CudaRNGStatesTracker.add
    _saved["fork"] = mrandom.CudaRNGStatesTracker.fork
    utils.GlobalMemoryBuffer.get_tensor = _cpu_get_tensor
    mrandom.CudaRNGStatesTracker.add = _cpu_add
    mrandom.CudaRNGStatesTracker.fork = _cpu_fork
    from megatron.core.tensor_parallel import layers, mappings

    _saved["torch_of"] = {m: m.torch for m in (layers, mappings)}
    for m in (layers, mappings):
        m.torch = _TorchOnCpu()


def restore() -> None:
    """Remove the redirections (the classes get megatron-core's own methods back)."""
    if not _saved:
        return
    from megatron.core import utils
    from megatron.core.models.common.embeddings import rotary_pos_embedding as rope
    from megatron.core.tensor_parallel import random as mrandom

    from megatron.core.models.common.language_module.language_module import LanguageModule

    LanguageModule.setup_embeddings_and_output_layer = _saved.pop("setup_embeddings")
    rope.RotaryEmbedding.get_emb = _saved.pop("get_emb")
    utils.GlobalMemoryBuffer.get_tensor = _saved.pop("get_tensor")
    mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state = _saved.pop("get_state"), _saved.pop("set_state")
    mrandom.CudaRNGStatesTracker.add = _saved.pop("add")
    mrandom.CudaRNGStatesTracker.fork = _saved.pop("fork")
    for m, t in _saved.pop("torch_of").items():
        m.torch = t
