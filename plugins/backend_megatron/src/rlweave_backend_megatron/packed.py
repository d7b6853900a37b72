"""Packed micro-batches (THD: samples one after another in one row, no padding) for megatron-core's
local layers.

megatron-core's own core attention of the local layer spec (``DotProductAttention``) refuses
packed sequences; :class:`PackedDotProductAttention` takes its place in the spec
(:func:`local_spec`) and runs causal attention within each sample of a packed micro-batch
(``packed_seq_params`` with ``qkv_format="thd"``: ``cu_seqlens_q`` bounds the samples), and
megatron's own for right-padded rows. megatron-core applies the rotary embedding per sample
(positions restart at each sample) before the core attention is called.

On CPU the attention runs in fp32 whatever the model's dtype (faster there and as the padded
path's fp32 softmax; bench/cpu_attention.py), on CUDA in the model's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention


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
        work = torch.float32 if query.device.type == "cpu" else dtype
        rep = query.shape[1] // key.shape[1]
        cu = packed_seq_params.cu_seqlens_q.tolist()
        outs = []
        for a, b in zip(cu[:-1], cu[1:]):
            q = query[a:b].transpose(0, 1).to(work)  # (heads, s, d)
            k = key[a:b].transpose(0, 1).to(work).repeat_interleave(rep, dim=0)
            v = value[a:b].transpose(0, 1).to(work).repeat_interleave(rep, dim=0)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
            outs.append(o.transpose(0, 1).to(dtype))
        return torch.cat(outs, dim=0)


def local_spec(qk_norm: bool = False):
    """megatron-core's local GPT layer spec (with query/key norms when ``qk_norm``) with
    :class:`PackedDotProductAttention` as core attention."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    spec = specs.get_gpt_layer_local_spec(qk_layernorm=qk_norm)
    spec.submodules.self_attention.submodules.core_attention = PackedDotProductAttention
    return spec


def params(cu_seqlens: torch.Tensor, device):
    """megatron's ``PackedSeqParams`` (THD) of samples bounded by ``cu_seqlens``."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = cu_seqlens.to(device=device, dtype=torch.int32)
    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                           max_seqlen_kv=longest)
