"""Hugging Face <-> megatron-core names and layouts for Qwen2 / Qwen3 / Llama-family dense models
and Qwen3-MoE.

Three layers of tensors appear here:

* **HF tensors**, as transformers saves them (``model.layers.3.self_attn.q_proj.weight``...).
* **Full megatron tensors**: one per megatron parameter name with its *global* layer index
  (``decoder.layers.3.self_attn...``), in megatron's layout but not split over tensor-parallel
  ranks: the QKV projection fuses q, k and v *per key/value group* (each group's query heads,
  then its key head, then its value head: GQA), ``linear_fc1`` stacks gate over up, the
  embedding and output rows are padded to :attr:`Shape.padded_vocab`; Qwen3's per-head query and
  key norms (``q_norm``, ``k_norm``) are megatron's ``q_layernorm`` / ``k_layernorm``.
* **Shards**: a full tensor split for one tensor-parallel rank. Column-parallel tensors
  split rows (the QKV by whole groups, ``linear_fc1`` as gate-part over up-part), row-parallel
  ones split columns, norms and the scalar head are replicated (the query/key norms too: each
  tensor-parallel rank applies them to its own heads, so their gradients are summed over the ranks,
  :func:`tp_summed`).

A Qwen3-MoE layer's MLP (:mod:`.moe`) has ``mlp.router.weight`` (HF ``mlp.gate.weight``) and the
experts stacked: ``mlp.experts.gate_up`` ``(E, 2I, H)`` (each expert's gate rows over its up
rows) and ``mlp.experts.down`` ``(E, H, I)`` (HF one matrix per expert,
``mlp.experts.<e>.{gate,up,down}_proj.weight``). They are replicated over tensor-parallel ranks
and split by experts over expert-parallel ranks (:func:`split_ep`).

:func:`full_from_hf` and :func:`hf_from_full` convert between the first two (a reader
function supplies HF tensors one at a time, so no whole model is loaded);
:func:`split` and :func:`merge` between the last two. Names with a layer index are global;
:func:`local_to_global` maps a pipeline stage's local layer numbering to it.

Transformer Engine layer specs fuse the two norms into the following linear layers
(``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``); :func:`canonical`
maps those names to the local spec's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

SUPPORTED = ("qwen2", "qwen3", "llama", "qwen3_moe")
HEAD = "output_layer.score"  # the scalar head of value / reward models (replicated Linear(hidden, 1))
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_TE_ALIASES = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
               "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight"}


@dataclass(frozen=True)
class Shape:
    """What the conversion needs from a HF ``config.json`` (its ``text_config`` where present)."""

    arch: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    layers: int
    vocab: int
    padded_vocab: int
    tied: bool
    qkv_bias: bool
    rope_theta: float
    norm_eps: float
    max_positions: int
    qk_norm: bool = False
    num_experts: int = 0  # MoE: experts per layer (0: dense), top-k, each expert's width, renormalised top-k
    top_k: int = 0
    moe_ffn: int = 0
    norm_topk: bool = False

    @property
    def q_per_group(self) -> int:
        return self.heads // self.kv_heads


def shape_from_config(cfg: dict[str, Any], tp: int = 1, vocab_multiple: int = 128, source: str = "config.json") -> Shape:
    """A :class:`Shape` from a HF config dict; raises ValueError naming ``source`` and the key
    for an architecture or setting this backend does not convert."""
    from rlweave_backend_megatron.checks import architecture_problems, num_experts

    problems = architecture_problems(cfg)
    if problems:
        raise ValueError(f"megatron backend: {source}: " + "; ".join(problems))
    arch = cfg.get("model_type")
    cfg = cfg.get("text_config", cfg)
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    vocab = int(cfg["vocab_size"])
    mult = max(1, int(vocab_multiple)) * max(1, int(tp))
    return Shape(
        arch=arch, hidden=hidden, heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads), ffn=int(cfg["intermediate_size"]),
        layers=int(cfg["num_hidden_layers"]), vocab=vocab, padded_vocab=-(-vocab // mult) * mult,
        tied=bool(cfg.get("tie_word_embeddings", False)), qkv_bias=arch == "qwen2",
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), max_positions=int(cfg.get("max_position_embeddings", 4096)),
        qk_norm=arch in ("qwen3", "qwen3_moe"), num_experts=int(num_experts(cfg) or 0),
        top_k=int(cfg.get("num_experts_per_tok") or 0), moe_ffn=int(cfg.get("moe_intermediate_size") or 0),
        norm_topk=bool(cfg.get("norm_topk_prob", False)))


# ---------------------------------------------------------------- names
def canonical(name: str) -> str:
    """The local-spec name of a megatron parameter name (Transformer Engine's fused-norm names mapped)."""
    m = _LAYER.match(name)
    if m and m.group(2) in _TE_ALIASES:
        return f"decoder.layers.{m.group(1)}.{_TE_ALIASES[m.group(2)]}"
    return name


def local_to_global(name: str, offset: int) -> str:
    """A stage-local megatron name with its layer index shifted by the stage's first layer."""
    m = _LAYER.match(name)
    return f"decoder.layers.{int(m.group(1)) + offset}.{m.group(2)}" if m else name


def full_names(shape: Shape, kind: str = "causal_lm") -> list[str]:
    """Every full megatron tensor name of the model, in export order (embedding, layers, final
    norm, output layer or scalar head)."""
    names = ["embedding.word_embeddings.weight"]
    per_layer = ["input_layernorm.weight", "self_attention.linear_qkv.weight"]
    if shape.qkv_bias:
        per_layer.append("self_attention.linear_qkv.bias")
    if shape.qk_norm:
        per_layer += ["self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"]
    per_layer += ["self_attention.linear_proj.weight", "pre_mlp_layernorm.weight"]
    per_layer += (["mlp.router.weight", "mlp.experts.gate_up", "mlp.experts.down"] if shape.num_experts
                  else ["mlp.linear_fc1.weight", "mlp.linear_fc2.weight"])
    for i in range(shape.layers):
        names += [f"decoder.layers.{i}.{p}" for p in per_layer]
    names.append("decoder.final_layernorm.weight")
    if kind != "causal_lm":
        names.append(HEAD + ".weight")
    elif not shape.tied:
        names.append("output_layer.weight")
    return names


_HF_LAYER = {"input_layernorm.weight": "input_layernorm.weight", "pre_mlp_layernorm.weight":
             "post_attention_layernorm.weight", "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
             "mlp.linear_fc2.weight": "mlp.down_proj.weight", "self_attention.q_layernorm.weight":
             "self_attn.q_norm.weight", "self_attention.k_layernorm.weight": "self_attn.k_norm.weight"}


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


def full_from_hf(name: str, read: Callable[[str], torch.Tensor], shape: Shape) -> torch.Tensor:
    """The full megatron tensor ``name`` (global layer index) built from HF tensors ``read(hf_name)``
    (KeyError naming the HF tensor when ``read`` has none)."""
    name = canonical(name)
    raw = read

    def read(hf_name: str) -> torch.Tensor:
        t = raw(hf_name)
        if t is None:
            raise KeyError(f"megatron backend: the model directory has no tensor {hf_name} (needed for {name})")
        return t

    if name == "embedding.word_embeddings.weight":
        return _pad_rows(read("model.embed_tokens.weight"), shape.padded_vocab)
    if name == "output_layer.weight":
        return _pad_rows(read("model.embed_tokens.weight" if shape.tied else "lm_head.weight"), shape.padded_vocab)
    if name == "decoder.final_layernorm.weight":
        return read("model.norm.weight")
    if name == HEAD + ".weight":
        return read("score.weight")
    m = _LAYER.match(name)
    if not m:
        raise KeyError(f"megatron backend: no HF source for parameter {name}")
    i, rest = m.group(1), m.group(2)
    pre = f"model.layers.{i}."
    if rest in _HF_LAYER:
        return read(pre + _HF_LAYER[rest])
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = rest.rsplit(".", 1)[1]
        q, k, v = (read(f"{pre}self_attn.{p}_proj.{kind}") for p in "qkv")
        return fuse_qkv(q, k, v, shape)
    if rest == "mlp.linear_fc1.weight":
        return torch.cat([read(pre + "mlp.gate_proj.weight"), read(pre + "mlp.up_proj.weight")])
    if rest == "mlp.router.weight":
        return read(pre + "mlp.gate.weight")
    if rest == "mlp.experts.gate_up":
        return torch.stack([torch.cat([read(f"{pre}mlp.experts.{e}.gate_proj.weight"),
                                       read(f"{pre}mlp.experts.{e}.up_proj.weight")]) for e in range(shape.num_experts)])
    if rest == "mlp.experts.down":
        return torch.stack([read(f"{pre}mlp.experts.{e}.down_proj.weight") for e in range(shape.num_experts)])
    raise KeyError(f"megatron backend: no HF source for parameter {name}")


def hf_from_full(name: str, full: torch.Tensor, shape: Shape) -> list[tuple[str, torch.Tensor]]:
    """The HF tensors of the full megatron tensor ``name`` (global layer index), padding dropped."""
    name = canonical(name)
    if name == "embedding.word_embeddings.weight":
        return [("model.embed_tokens.weight", full[: shape.vocab])]
    if name == "output_layer.weight":
        return [] if shape.tied else [("lm_head.weight", full[: shape.vocab])]
    if name == "decoder.final_layernorm.weight":
        return [("model.norm.weight", full)]
    if name == HEAD + ".weight":
        return [("score.weight", full)]
    m = _LAYER.match(name)
    if not m:
        raise KeyError(f"megatron backend: no HF name for parameter {name}")
    i, rest = m.group(1), m.group(2)
    pre = f"model.layers.{i}."
    if rest in _HF_LAYER:
        return [(pre + _HF_LAYER[rest], full)]
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = rest.rsplit(".", 1)[1]
        q, k, v = unfuse_qkv(full, shape)
        return [(f"{pre}self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v))]
    if rest == "mlp.linear_fc1.weight":
        gate, up = full.chunk(2, dim=0)
        return [(pre + "mlp.gate_proj.weight", gate), (pre + "mlp.up_proj.weight", up)]
    if rest == "mlp.router.weight":
        return [(pre + "mlp.gate.weight", full)]
    if rest == "mlp.experts.gate_up":
        out = []
        for e in range(full.shape[0]):
            gate, up = full[e].chunk(2, dim=0)
            out += [(f"{pre}mlp.experts.{e}.gate_proj.weight", gate), (f"{pre}mlp.experts.{e}.up_proj.weight", up)]
        return out
    if rest == "mlp.experts.down":
        return [(f"{pre}mlp.experts.{e}.down_proj.weight", full[e]) for e in range(full.shape[0])]
    raise KeyError(f"megatron backend: no HF name for parameter {name}")


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: Shape) -> torch.Tensor:
    """HF q/k/v projections (weights ``(heads*d, hidden)`` or biases) -> megatron's per-group fused layout."""
    g, d, per = shape.kv_heads, shape.head_dim, shape.q_per_group
    rest = q.shape[1:]
    parts = [q.reshape(g, per * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)]
    return torch.cat(parts, dim=1).reshape(g * (per + 2) * d, *rest)


def unfuse_qkv(full: torch.Tensor, shape: Shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv`."""
    g, d, per = shape.kv_heads, shape.head_dim, shape.q_per_group
    rest = full.shape[1:]
    grouped = full.reshape(g, (per + 2) * d, *rest)
    q, k, v = grouped.split([per * d, d, d], dim=1)
    return (q.reshape(g * per * d, *rest).contiguous(), k.reshape(g * d, *rest).contiguous(),
            v.reshape(g * d, *rest).contiguous())


# ---------------------------------------------------------------- tensor-parallel split / merge
def split_kind(name: str) -> str:
    """How ``name`` is split over tensor-parallel ranks: ``rows`` (column-parallel),
    ``cols`` (row-parallel), ``gate_up`` (rows of gate and up separately) or ``none``."""
    name = canonical(name)
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias")) or name in (
            "embedding.word_embeddings.weight", "output_layer.weight"):
        return "rows"
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return "cols"
    if name.endswith("linear_fc1.weight"):
        return "gate_up"
    return "none"


def tp_summed(name: str) -> bool:
    """Whether ``name`` is replicated over tensor-parallel ranks but gets a different gradient on
    each (the query/key norms, applied to each rank's own heads): its gradient is summed over them."""
    return canonical(name).endswith(("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"))


def split(name: str, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Tensor-parallel rank ``rank``'s shard of the full tensor ``name``."""
    how = split_kind(name)
    if how == "none" or tp == 1:
        return full
    if how == "rows":
        return full.chunk(tp, dim=0)[rank]
    if how == "cols":
        return full.chunk(tp, dim=1)[rank]
    gate, up = full.chunk(2, dim=0)
    return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]])


def is_expert(name: str) -> bool:
    """Whether ``name`` holds stacked experts (split over expert-parallel ranks, dim 0)."""
    return ".mlp.experts." in name


def split_ep(name: str, full: torch.Tensor, ep: int, rank: int) -> torch.Tensor:
    """Expert-parallel rank ``rank``'s experts of the full tensor ``name`` (other tensors whole)."""
    return full.chunk(ep, dim=0)[rank] if ep > 1 and is_expert(name) else full


def merge(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The full tensor ``name`` from its shards in tensor-parallel rank order."""
    how = split_kind(name)
    if how == "none" or len(shards) == 1:
        return shards[0]
    if how == "rows":
        return torch.cat(shards, dim=0)
    if how == "cols":
        return torch.cat(shards, dim=1)
    halves = [s.chunk(2, dim=0) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves])


def iter_hf(names: list[str], fulls: Callable[[str], torch.Tensor], shape: Shape) -> Iterator[tuple[str, torch.Tensor]]:
    """HF tensors of the full tensors ``fulls(name)`` for ``names``, one full tensor at a time."""
    for n in names:
        yield from hf_from_full(n, fulls(n), shape)
