"""A vision-language model's packed forward: its images' features and multimodal positions.

:class:`VisionForward` (for a model with a vision tower, :func:`for_model`) turns one packed
micro-batch (token ids, ``cu_seqlens`` and each sample's vision inputs,
:attr:`rlweave.data.batch.Batch.mm`) into the extra keyword inputs of the model's forward:

* ``position_ids`` ``(4, 1, T)``: row 0 each token's position inside its own sample (what
  transformers reads to keep packed samples apart), rows 1-3 the multimodal rotary positions
  of each sample (:func:`rlweave.data.vision.mrope_positions`, restarting at every sample and
  continuing over its response), so a sample's outputs do not depend on what it is packed with;
* ``mm_encoder_outputs``: the features of the micro-batch's images, in sample order, computed
  by calling the vision tower on its own (never with the text's varlen keywords), placed on the
  tokens :func:`~rlweave.data.vision.mrope_positions` takes for images (an image token the model
  sampled in a response stays text, as it was for the engine that sampled it); an image that
  occurs more than once in the micro-batch (the samples of one prompt) is encoded once and its
  copies' features are rows of its features (:mod:`.vision_dedup`; gradients of the copies sum);
* when the micro-batch has no image, the vision tower still runs, on one blank image of the
  smallest grid, and its features, cut to none, enter the model where image features do: every
  rank runs the same modules forward and backward in the same order (sharded parameters are
  gathered and their gradients reduced on every rank alike) and the results are unchanged.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from rlweave.backend_helpers.hf_model import vision_dedup
from rlweave.data.vision import mrope_positions


def freeze_tower(model: nn.Module, where: str) -> set[str]:
    """Stop training ``model``'s vision tower (``requires_grad`` off) and return its parameters'
    names (``model.named_parameters()``), which a backend then keeps out of the optimizer, its
    checkpoints and the weight sync (the engine loaded the same tower). ValueError naming
    ``where`` (the option's key) for a model without one."""
    module = tower(model)
    if module is None:
        raise ValueError(f"{where}: the model has no vision tower to freeze")
    params = {id(p) for p in module.parameters()}
    names = set()
    for name, p in model.named_parameters():
        if id(p) in params:
            p.requires_grad_(False)
            names.add(name)
    return names


def tower(model: nn.Module) -> nn.Module | None:
    """The vision tower of ``model`` (an HF model, under no adapter wrapper), None for a text model."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "get_image_features"):
        return None
    return getattr(inner, "visual", None)


def for_model(model: nn.Module) -> "VisionForward | None":
    """The :class:`VisionForward` of ``model`` (an HF model, under no adapter wrapper), None for
    a model without a vision tower. It takes over the model's ``get_placeholder_mask``: one per
    model."""
    if tower(model) is None:
        return None
    return VisionForward(model.model, model.config)


class VisionForward:
    """See the module docstring. ``inner``: the model's backbone (``visual`` and
    ``get_image_features``); ``config``: the top-level config (``image_token_id`` and the vision
    config's ``spatial_merge_size``, ``patch_size``, ``temporal_patch_size``, ``in_channels``);
    ``dedup``: encode each distinct image of a micro-batch once (False: every copy, as a
    reference to compare with)."""

    def __init__(self, inner: nn.Module, config: Any, dedup: bool = True) -> None:
        self.inner = inner
        self.dedup = dedup
        self._image_mask: torch.Tensor | None = None  # the image tokens of the row being run
        self._model_mask = inner.get_placeholder_mask
        inner.get_placeholder_mask = self._placeholder_mask  # the images' places are the ones positions() found
        self.image_token_id = int(config.image_token_id)
        vc = config.vision_config
        self.merge = int(vc.spatial_merge_size)
        self.patch_dim = int(vc.in_channels) * int(vc.temporal_patch_size) * int(vc.patch_size) ** 2

    @property
    def visual(self) -> nn.Module:
        return self.inner.visual

    def positions(self, ids: torch.Tensor, cu: torch.Tensor,
                  mm: Sequence[dict | None]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(4, 1, T)`` position ids of a packed row (module docstring) and the bool ``(T,)``
        mask of its image tokens (an image token a model sampled in a response is text)."""
        bounds = cu.tolist()
        rows, masks = [], []
        for i in range(len(bounds) - 1):
            grid = mm[i]["image_grid_thw"] if mm and mm[i] is not None else None
            pos, mask = mrope_positions(ids[bounds[i]:bounds[i + 1]].cpu(), grid, self.image_token_id, self.merge,
                                        with_mask=True)
            rows.append(pos)
            masks.append(mask)
        mrope = torch.cat(rows, dim=1)
        lens = cu[1:] - cu[:-1]
        text = torch.arange(int(bounds[-1])) - torch.repeat_interleave(cu[:-1], lens)
        return torch.cat([text.view(1, -1), mrope], dim=0).unsqueeze(1), torch.cat(masks)

    def _placeholder_mask(self, input_ids: Any, inputs_embeds: torch.Tensor, image_features: Any = None,
                          video_features: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's ``get_placeholder_mask`` with this row's image tokens (:meth:`positions`) as
        the images' places, not every image token of the row."""
        mask = self._image_mask
        if mask is None or inputs_embeds.shape[1] != mask.numel():
            return self._model_mask(input_ids, inputs_embeds, image_features, video_features)
        if image_features is not None and int(mask.sum()) * inputs_embeds.shape[-1] != image_features.numel():
            raise ValueError(f"{int(mask.sum())} image tokens but {image_features.shape[0]} image features")
        image = mask.to(inputs_embeds.device).view(1, -1, 1).expand_as(inputs_embeds)
        return image, torch.zeros_like(image)

    def _encode(self, mm: Sequence[dict | None], device) -> tuple[Any | None, vision_dedup.Distinct | None]:
        """``(out, distinct)``: ``get_image_features``' output on the samples' distinct images and,
        when some image occurs more than once, the :class:`.vision_dedup.Distinct` that says
        which row of ``out``'s concatenated features each image token takes (None: ``out`` is
        of every image in order). ``(None, None)`` when there are no images."""
        have = [m for m in (mm or []) if m is not None]
        if not have:
            return None, None
        uniq = vision_dedup.distinct(have, self.merge) if self.dedup else None
        if uniq is None:
            pixels = torch.cat([m["pixel_values"] for m in have]).to(device)
            grid = torch.cat([m["image_grid_thw"] for m in have]).to(device)
            return self.inner.get_image_features(pixels, grid, return_dict=True), None
        return self.inner.get_image_features(uniq.pixels.to(device), uniq.grid.to(device), return_dict=True), uniq

    def features(self, mm: Sequence[dict | None], device) -> Any | None:
        """The image features of the samples' images in order (``get_image_features``' output,
        whose ``pooler_output`` holds one tensor per image; an image that occurs more than once
        is encoded once, its copies' features rows of its own, and then the output's other
        fields are of the distinct images), None when there are none."""
        out, uniq = self._encode(mm, device)
        if uniq is not None:
            rows = torch.cat(list(out.pooler_output)).index_select(0, uniq.index.to(device))
            out.pooler_output = torch.split(rows, uniq.sizes)
        return out

    def blank(self, device) -> Any:
        """The vision tower on one blank image of the smallest grid, its features cut to none:
        features of zero image tokens that depend on every vision parameter."""
        grid = torch.tensor([[1, self.merge, self.merge]], dtype=torch.long, device=device)
        pixels = torch.zeros((self.merge * self.merge, self.patch_dim), device=device)
        out = self.inner.get_image_features(pixels, grid, return_dict=True)
        out.pooler_output = tuple(f[:0] for f in out.pooler_output)
        return out

    def inputs(self, ids: torch.Tensor, cu: torch.Tensor, mm: Sequence[dict | None], device) -> dict[str, Any]:
        """The keyword inputs of one packed row's forward, which must follow (module docstring)."""
        feats = self.features(mm, device)
        positions, self._image_mask = self.positions(ids, cu, mm)
        return {"position_ids": positions.to(device),
                "mm_encoder_outputs": {"image": feats if feats is not None else self.blank(device)}}

    def slice_inputs(self, ids: torch.Tensor, cu: torch.Tensor, mm: Sequence[dict | None], lo: int, n: int,
                     device) -> dict[str, Any]:
        """:meth:`inputs` for the tokens ``[lo, lo + n)`` of the row (a sequence-parallel rank's
        slice; positions past the row's end are padding, text positions from 0): the slice's
        positions and the features of the image tokens in it, which must follow."""
        positions, mask = self.positions(ids, cu, mm)
        total = int(mask.numel())
        pad = max(0, lo + n - total)
        if pad:
            filler = torch.arange(pad).view(1, 1, -1).expand(4, 1, pad)
            positions = torch.cat([positions, filler], dim=2)
            mask = torch.cat([mask, torch.zeros(pad, dtype=torch.bool)])
        feats, uniq = self._encode(mm, device)
        if feats is None:
            feats = self.blank(device)
        else:  # the features of the image tokens in the slice: rows of the distinct images' features
            before, k = int(mask[:lo].sum()), int(mask[lo:lo + n].sum())
            flat = torch.cat(list(feats.pooler_output))
            feats.pooler_output = (flat[before:before + k] if uniq is None else
                                   flat.index_select(0, uniq.index[before:before + k].to(device)),)
        self._image_mask = mask[lo:lo + n]
        return {"position_ids": positions[:, :, lo:lo + n].to(device), "mm_encoder_outputs": {"image": feats}}
