"""What a transformers ``generate`` (or first forward) of a vision-language model takes besides the
token ids, shared by the transformers engine and the in-process evaluator
(:mod:`rlweave.algo_helpers.local_generate`).

:func:`image_inputs` gives the images of a batch's rows (each row's vision inputs,
:data:`rlweave.data.vision.MM_KEYS`, or None) in row order, with which tokens are image tokens, and
forgets the M-RoPE offsets transformers keeps on the model from its previous call (a call without
images, or of another batch size, would otherwise reuse them). Imports torch when called.
"""

from __future__ import annotations

from typing import Any, Sequence


def image_inputs(model: Any, rows: Sequence[dict[str, Any] | None], ids: Any, where: str) -> dict[str, Any]:
    """``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` for ``model`` and the rows of
    ``ids`` (``(rows, width)``, on the model's device) whose vision inputs are ``rows``; ``{}`` when
    no row has images. A row with images for a model without a vision tower is a ValueError
    naming ``where``."""
    import torch

    inner = getattr(model, "model", None)
    vision = inner is not None and getattr(inner, "visual", None) is not None
    if vision:
        inner.rope_deltas = None
    have = [m for m in rows if m is not None]
    if not have:
        return {}
    if not vision:
        raise ValueError(f"{where}: a prompt with images, but the model is not a vision-language model")
    return {"pixel_values": torch.cat([m["pixel_values"] for m in have]).to(ids.device, model.dtype),
            "image_grid_thw": torch.cat([m["image_grid_thw"] for m in have]).to(ids.device),
            "mm_token_type_ids": (ids == int(model.config.image_token_id)).int()}
