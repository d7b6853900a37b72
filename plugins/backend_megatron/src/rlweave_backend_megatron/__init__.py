"""rlweave training backend on megatron-core: a ``GPTModel`` per role, with tensor (``tp``),
pipeline (``pp``) and data (``dp``) parallel sizes from ``roles.<role>.parallel``.

Causal LMs, value and reward models of Qwen2/Qwen2.5, Qwen3 and Llama-family dense checkpoints are
loaded from a Hugging Face directory into their tensor/pipeline shards and written back in
Hugging Face names. On GPU the ranks talk over NCCL and use Transformer Engine layers where it
is installed; on CPU (gloo, tests) they use megatron-core's local layer specs, after the few
CUDA-only calls are redirected by :mod:`rlweave_backend_megatron.cpu_shim`.

This module and ``plugin``, ``config`` and ``checks`` stay light (no torch, no megatron import):
the plugin manager imports them to list and validate the backend.
"""
