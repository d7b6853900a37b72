"""Building one pipeline stage of a megatron-core ``GPTModel`` from a :class:`~.convert.Shape`.

Contract: :func:`build` runs after ``parallel_state.initialize_model_parallel`` on every rank;
it returns the stage's module on ``device`` in ``dtype`` with the weights of the HF directory
(``read(hf_name)`` supplies one HF tensor at a time), already split for this rank.

Value and reward models (``kind`` ``value`` / ``reward``) replace the output layer with
:class:`ScalarHead` (a replicated ``Linear(hidden, 1)`` without bias): its HF name is
``score.weight``, as in the FSDP backend and transformers' classification models. A
directory without ``score.weight`` starts the head at zero (``value``) or small random
(``reward``), as the FSDP backend does.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from rlweave_backend_megatron import convert


class ScalarHead(nn.Module):
    """Stands in for ``GPTModel.output_layer``: ``(s, b, h) -> ((s, b, 1), None)``. With sequence
    parallelism its input holds this rank's slice of the sequence: it is gathered first, and its
    gradient split back without a sum (every tensor-parallel rank computes the same loss on the
    whole sequence, as with the vocabulary-parallel logits' replicated loss)."""

    def __init__(self, hidden: int, dtype: torch.dtype, sequence_parallel: bool = False):
        super().__init__()
        self.score = nn.Linear(hidden, 1, bias=False, dtype=dtype)
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden_states, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden_states = gather_from_sequence_parallel_region(hidden_states, tensor_parallel_output_grad=False)
        return self.score(hidden_states), None


def transformer_config(shape: convert.Shape, tp: int, pp: int, dtype: torch.dtype, recompute: bool,
                       sequence_parallel: bool = False):
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    kw = {}
    if recompute:
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    return TransformerConfig(
        num_layers=shape.layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
        num_query_groups=shape.kv_heads, kv_channels=shape.head_dim, ffn_hidden_size=shape.ffn,
        normalization="RMSNorm", layernorm_epsilon=shape.norm_eps, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=shape.qkv_bias, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, params_dtype=dtype,
        bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, pipeline_dtype=dtype,
        use_cpu_initialization=True, perform_initialization=False, bias_activation_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False,
        gradient_accumulation_fusion=False, attention_softmax_in_fp32=True, qk_layernorm=shape.qk_norm,
        sequence_parallel=sequence_parallel, **kw)


def layer_spec(impl: str, qk_norm: bool = False, mlp: type | None = None):
    """The layer spec of ``impl`` (``local``: plain torch modules, with core attention that also
    takes packed micro-batches, :mod:`.packed`; ``transformer_engine``: its own, THD included),
    with query/key norms when ``qk_norm`` (Qwen3) and the MoE MLP class ``mlp`` (local only)."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if impl == "transformer_engine":
        if mlp is not None:
            raise ValueError("megatron backend: mixture-of-experts models use the local layer spec "
                             "(options.transformer_impl: local or auto)")
        return specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=qk_norm)
    from rlweave_backend_megatron import packed

    return packed.local_spec(qk_norm, mlp)


def build(shape: convert.Shape, kind: str, impl: str, tp: int, tp_rank: int, pp: int, pp_rank: int,
          dtype: torch.dtype, device: torch.device, read: Callable[[str], torch.Tensor | None], seed: int,
          recompute: bool = False, sequence_parallel: bool = False, ep_rank: int = 0,
          kernel: Any = None) -> tuple[nn.Module, int]:
    """The stage's model with its weights (a mixture-of-experts model: the experts of
    expert-parallel rank ``ep_rank``, run by ``kernel`` when given, :mod:`.moe`), and the global
    index of its first layer."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    first, last = pp_rank == 0, pp_rank == pp - 1
    cfg = transformer_config(shape, tp, pp, dtype, recompute, sequence_parallel)
    mlp = None
    if shape.num_experts:
        from rlweave_backend_megatron import moe

        mlp = moe.layer_class(moe.Experts(shape.num_experts, shape.top_k, shape.moe_ffn, shape.norm_topk), kernel)
    ep = ps.get_expert_model_parallel_world_size() if shape.num_experts else 1
    spec = layer_spec(impl, shape.qk_norm, mlp)
    if impl != "transformer_engine":  # the final norm too is ours (.norms), not megatron's WrappedTorchNorm
        from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

        from rlweave_backend_megatron.norms import RMSNorm

        spec = TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(cfg, pp_rank=pp_rank),
                                          layer_norm=RMSNorm)
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=shape.padded_vocab,
                     max_sequence_length=shape.max_positions, pre_process=first, post_process=last,
                     share_embeddings_and_output_weights=shape.tied and kind == "causal_lm",
                     position_embedding_type="rope", rotary_base=int(shape.rope_theta)
                     if float(shape.rope_theta).is_integer() else shape.rope_theta, parallel_output=True)
    if last and kind != "causal_lm":
        model.output_layer = ScalarHead(shape.hidden, dtype, sequence_parallel)
    offset = pp_rank * (shape.layers // pp)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gname = _stage_name(name, offset)
            full = _full(gname, read, shape, kind, seed)
            shard = convert.split_ep(gname, convert.split(gname, full, tp, tp_rank), ep, ep_rank)
            if tuple(shard.shape) != tuple(p.shape):
                raise ValueError(f"megatron backend: {gname}: shard of shape {tuple(shard.shape)} does not fit "
                                 f"the parameter's {tuple(p.shape)}")
            p.copy_(shard.to(p.dtype))
    return model.to(device), offset


def _stage_name(name: str, offset: int) -> str:
    """The global full-tensor name of a stage parameter (a tied output weight on the last stage
    of a pipeline is the embedding's copy)."""
    if name == "output_layer.score.weight":
        return convert.HEAD + ".weight"
    return convert.local_to_global(name, offset)


def _full(gname: str, read, shape: convert.Shape, kind: str, seed: int) -> torch.Tensor:
    if gname == convert.HEAD + ".weight":
        w = read("score.weight")
        if w is not None:
            if tuple(w.shape) != (1, shape.hidden):
                raise ValueError(f"megatron backend: score.weight has shape {tuple(w.shape)}, want (1, {shape.hidden})")
            return w
        if kind == "value":
            return torch.zeros(1, shape.hidden)
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(1, shape.hidden, generator=gen) / (shape.hidden + 1) ** 0.5

    def need(n: str) -> torch.Tensor:
        t = read(n)
        if t is None:
            raise KeyError(f"megatron backend: the model directory has no tensor {n}")
        return t

    return convert.full_from_hf(gname, need, shape)
