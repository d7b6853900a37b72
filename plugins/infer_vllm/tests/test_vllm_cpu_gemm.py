"""Which CPU GEMM handles :func:`rlweave_infer_vllm.cpu_gemm.rebuild_stale_gemms` rebuilds,
on layers packed by vLLM's own CPU processing (``UnquantizedEmbeddingMethod``), without an
engine: a reload is played by writing new weights in place and re-running the processing of
the layers that "received" them, as vLLM's layer-wise reload does."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM not installed (pip install rlweave-infer-vllm[cpu] or [gpu])")


@pytest.fixture(autouse=True)
def _cpu_only():
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM packs GEMM weights on CPU only")


def _layer(weight):
    import torch
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    layer = torch.nn.Module()
    layer.weight = weight if isinstance(weight, torch.nn.Parameter) else torch.nn.Parameter(weight, requires_grad=False)
    layer.quant_method = UnquantizedEmbeddingMethod()
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def _model():
    """embed/head share one weight (tied); other/other_head do not."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Module()
    model.embed = _layer(torch.randn(64, 32))
    model.head = _layer(model.embed.weight)
    model.other = _layer(torch.randn(64, 32))
    model.other_head = _layer(torch.randn(64, 32))
    return model


def _right(layer) -> bool:
    import torch

    x = torch.randn(3, layer.weight.shape[1])
    return torch.allclose(layer.cpu_linear(x, layer.weight, None), x @ layer.weight.T, atol=1e-4)


def _reload(model, names):
    """Write new values into the named layers' weights and re-run their processing."""
    import torch

    for name in names:
        layer = getattr(model, name)
        layer.weight.data.copy_(torch.randn_like(layer.weight))
        layer.quant_method.process_weights_after_loading(layer)


def test_a_layer_sharing_a_reloaded_weight_is_rebuilt_and_nothing_else():
    from rlweave_infer_vllm.cpu_gemm import gemm_handles, rebuild_stale_gemms

    model = _model()
    before = gemm_handles(model)
    assert set(before) == {model.embed, model.head, model.other, model.other_head}
    _reload(model, ["embed", "other"])
    assert not _right(model.head)  # the packed head still holds the old weight
    untouched = model.other_head.cpu_linear
    assert rebuild_stale_gemms(model, before) == ["head"]
    assert all(_right(getattr(model, n)) for n in ("embed", "head", "other", "other_head"))
    assert model.other_head.cpu_linear is untouched


def test_no_update_no_rebuild_and_a_caller_written_layer_is_rebuilt():
    import torch

    from rlweave_infer_vllm.cpu_gemm import gemm_handles, rebuild_stale_gemms

    model = _model()
    assert rebuild_stale_gemms(model, gemm_handles(model)) == []
    before = gemm_handles(model)
    model.other_head.weight.data.copy_(model.other.weight)  # what a re-tie copy does
    assert rebuild_stale_gemms(model, before, written=[model.other_head]) == ["other_head"]
    assert _right(model.other_head)
    assert torch.equal(model.other_head.weight, model.other.weight)


def test_a_stale_layer_whose_processing_cannot_be_rerun_is_named():
    from rlweave_infer_vllm.cpu_gemm import gemm_handles, rebuild_stale_gemms

    model = _model()
    before = gemm_handles(model)
    model.head.quant_method = object()  # a method rlweave does not know to be a pure derivation
    _reload(model, ["embed"])
    with pytest.raises(RuntimeError, match="'head'.*cannot be re-run"):
        rebuild_stale_gemms(model, before)
