"""Packed micro-batches (THD: samples one after another in one row, no padding) for megatron-core's
local layers.

megatron-core's own core attention of the local layer spec (``DotProductAttention``) refuses
packed sequences; :class:`PackedDotProductAttention` takes its place in the spec
(:func:`local_spec`) and runs causal attention within each sample of a packed micro-batch
(``packed_seq_params`` with ``qkv_format="thd"``: ``cu_seqlens_q`` bounds the samples), and
megatron's own for right-padded rows. megatron-core applies the rotary embedding per sample
(positions restart at each sample) before the core attention is called.

On CUDA in bf16/fp16, with torch's ``varlen_attn``, the whole packed micro-batch is one fused
call (no per-sample loop, no host synchronisation); elsewhere each sample is one SDPA call, on
CPU in fp32 whatever the model's dtype (faster there, and as the padded path's fp32 softmax;
bench/cpu_attention.py).
"""

from __future__ import annotations

import functools
import inspect
import itertools

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention


@functools.lru_cache(maxsize=1)
def _fused():
    """``(varlen_attn, its keyword names)``, or ``(None, ())`` on a torch without it (causality
    is ``is_causal`` on some versions, ``window_size=(-1, 0)`` on others; ``enable_gqa`` from 2.12)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception:
        return None, ()
    return varlen_attn, tuple(inspect.signature(varlen_attn).parameters)


class PackedDotProductAttention(DotProductAttention):
    """``DotProductAttention`` that also takes packed micro-batches (module docstring).

    Packed inputs: ``query (t, heads, d)``, ``key``/``value`` ``(t, groups, d)`` (this rank's
    tensor-parallel share); returns ``(t, heads, d)``, which megatron's attention reshapes."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                   attention_bias=attention_bias, packed_seq_params=None)
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"megatron backend: packed attention takes qkv_format 'thd', not "
                             f"{packed_seq_params.qkv_format!r}")
        dtype = query.dtype
        rep = query.shape[1] // key.shape[1]
        fused, names = _fused()
        if fused is not None and query.is_cuda and dtype in (torch.bfloat16, torch.float16):
            extra = {"is_causal": True} if "is_causal" in names else {"window_size": (-1, 0)}
            k, v = key, value
            if rep > 1 and "enable_gqa" in names:
                extra["enable_gqa"] = True
            elif rep > 1:  # no GQA keyword: one key/value head per query head
                k, v = (x.repeat_interleave(rep, dim=1) for x in (key, value))
            cu = packed_seq_params.cu_seqlens_q
            longest = int(packed_seq_params.max_seqlen_q)
            return fused(query, k, v, cu, cu, longest, longest, scale=self.softmax_scale, **extra)
        work = torch.float32 if query.device.type == "cpu" else dtype
        cu = packed_seq_params.cu_seqlens_q.tolist()
        outs = []
        for a, b in itertools.pairwise(cu):
            q = query[a:b].transpose(0, 1).to(work)  # (heads, s, d)
            k = key[a:b].transpose(0, 1).to(work).repeat_interleave(rep, dim=0)
            v = value[a:b].transpose(0, 1).to(work).repeat_interleave(rep, dim=0)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
            outs.append(o.transpose(0, 1).to(dtype))
        return torch.cat(outs, dim=0)


def local_spec(qk_norm: bool = False, mlp: type | None = None):
    """megatron-core's local GPT layer spec (with query/key norms when ``qk_norm``) with
    :class:`PackedDotProductAttention` as core attention, :class:`.norms.RMSNorm` as every norm
    and ``mlp`` (a module class built with ``config``, the MoE MLP of :mod:`.moe`) as the MLP when given."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    from rlweave_backend_megatron.norms import RMSNorm

    spec = specs.get_gpt_layer_local_spec(qk_layernorm=qk_norm)
    layer = spec.submodules
    attn = layer.self_attention.submodules
    attn.core_attention = PackedDotProductAttention
    layer.input_layernorm = layer.pre_mlp_layernorm = RMSNorm
    if qk_norm:
        attn.q_layernorm = attn.k_layernorm = RMSNorm
    if mlp is not None:
        layer.mlp = mlp
    return spec


def params(cu_seqlens: torch.Tensor, device):
    """megatron's ``PackedSeqParams`` (THD) of samples bounded by ``cu_seqlens``."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = cu_seqlens.to(device=device, dtype=torch.int32)
    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                           max_seqlen_kv=longest)
