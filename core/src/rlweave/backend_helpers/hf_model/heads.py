"""The scalar heads of ``value`` (critic) and ``reward`` models.

:class:`ScalarHeadModel` is the HF backbone (``AutoModel``) under ``model.`` plus a bias-free
``score`` Linear(hidden, 1): the names of ``*ForSequenceClassification`` /
``*ForTokenClassification`` with ``num_labels=1``, so saved reward models load in
transformers as sequence classifiers and critics as token classifiers
(:mod:`rlweave.backend_helpers.hf_dir`). (A ``causal_lm`` keeps its own LM head.)

Initialising a head (:func:`init_head`): if the directory holds ``score.weight`` (a saved
reward model or critic) it is loaded -- this is how a critic starts from a reward model;
otherwise the head starts at zero for a critic (values start at 0) and small random for a
reward model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

HEAD_NAME = "score.weight"


class ScalarHeadModel(nn.Module):
    """Backbone + one scalar per token. ``forward`` returns float ``(B, T)``."""

    def __init__(self, backbone: nn.Module, hidden: int):
        super().__init__()
        self.model = backbone
        self.score = nn.Linear(hidden, 1, bias=False)

    @property
    def config(self):
        return self.model.config

    def gradient_checkpointing_enable(self, **kw: Any) -> None:
        self.model.gradient_checkpointing_enable(**kw)

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        # a fresh tensor, not a view: FSDP2 warns about (and mishandles in-place ops on) view outputs
        return self.score(out.last_hidden_state).squeeze(-1).to(torch.float32, copy=True)


def read_hf_tensor(path: str | Path, name: str) -> torch.Tensor | None:
    """One tensor from a HF directory's safetensors (single file or indexed shards), or None."""
    from rlweave.backend_helpers.hf_dir import HFReader

    try:
        with HFReader(path) as read:
            return read(name)
    except FileNotFoundError:
        return None


@torch.no_grad()
def init_head(model: ScalarHeadModel, path: str | Path, kind: str, dtype: torch.dtype, seed: int, *,
              backend: str) -> None:
    """Set ``model.score`` for a ``kind`` (``value`` or ``reward``) model from the directory
    ``path`` (see the module docstring); ValueError naming ``backend`` and the file for a
    non-zero ``score.bias`` or a ``score.weight`` of another shape."""
    hidden = model.score.weight.shape[1]
    w = read_hf_tensor(path, HEAD_NAME)
    bias = read_hf_tensor(path, "score.bias")
    if bias is not None and bias.abs().max() > 0:
        raise ValueError(f"{backend} backend: {path}: score.bias is non-zero; rlweave heads have no bias")
    if w is not None:
        if tuple(w.shape) != (1, hidden):
            raise ValueError(f"{backend} backend: {path}: score.weight has shape {tuple(w.shape)}, want (1, {hidden})")
        model.score.weight.copy_(w.to(dtype))
    elif kind == "value":
        model.score.weight.zero_()
    else:
        gen = torch.Generator().manual_seed(seed)
        model.score.weight.copy_((torch.randn(1, hidden, generator=gen) / (hidden + 1) ** 0.5).to(dtype))
