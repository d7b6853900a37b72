"""Images in prompts: loading them, turning a prompt with image placeholders into token ids and
vision inputs, and the multimodal positions of a sequence (Qwen2-VL).

Contracts:

* :func:`load_image` reads one image given as a path (relative to the data file's folder; a
  ``file://`` URL is a path), a ``data:`` URL or bare base64 string (:func:`looks_like_base64`),
  raw bytes, or a ``{"bytes", "path"}`` mapping (how parquet and ``datasets`` store images);
  the result is an RGB ``PIL.Image``. Problems raise :class:`ImageError` saying what was wrong
  with the value (a remote ``http(s)://`` URL is refused: nothing is downloaded).
* :class:`VisionProcessor` is loaded from a model directory (its tokenizer, its
  ``preprocessor_config.json`` and its ``config.json``) and used by every component that needs
  token ids of an image prompt (data validation, the engines, the trainers), with the same
  pixel bounds (``model.vision``: ``min_pixels``/``max_pixels``), so their token counts cannot
  differ. :meth:`VisionProcessor.encode` expands each image placeholder of a text into the
  image's tokens and returns the ids and the vision inputs (:data:`MM_KEYS`).
* :func:`mrope_positions` gives the ``(3, L)`` multimodal rotary positions of one sequence
  (prompt and response): text tokens advance all three rows together, an image's tokens carry
  their (time, row, column) offsets from the position the image starts at.

This module imports torch, PIL and transformers only inside the functions that need them.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
from pathlib import Path
from typing import Any, Sequence

#: the vision inputs of one sample: ``pixel_values`` ``(patches, patch_dim)`` float32 and
#: ``image_grid_thw`` ``(images, 3)`` int64, the images in the order of their placeholders
MM_KEYS = ("pixel_values", "image_grid_thw")

#: the model families whose vision inputs this module lays out (``config.json`` ``model_type``); Qwen2.5-VL
#: and Qwen3-VL differ in their towers and positions and are refused until they are tested
VISION_MODEL_TYPES = ("qwen2_vl",)


#: URL schemes of images that would have to be downloaded (refused)
REMOTE_SCHEMES = ("http://", "https://", "s3://", "gs://")


class ImageError(ValueError):
    """An image value that cannot be read (missing file, undecodable bytes, wrong type)."""


def is_vision_model(path: str | Path) -> bool:
    """Whether the model directory's ``config.json`` has a vision tower (a ``vision_config``)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("vision_config"), dict)


def load_image(value: Any, base_dir: str | Path | None = None):
    """One image as an RGB ``PIL.Image`` (see the module docstring for the accepted forms)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, dict):
        if value.get("bytes") is not None:
            value = value["bytes"]
        elif value.get("path"):
            value = value["path"]
        else:
            raise ImageError("an image mapping needs 'bytes' or 'path'")
    if isinstance(value, str):
        if value.startswith(REMOTE_SCHEMES):
            raise ImageError(f"{value[:60]!r} is a remote URL; images are not downloaded: download it and give its "
                             "path (or its bytes or base64)")
        if value.startswith("data:"):
            _, _, value = value.partition(",")
            data = _b64(value)
        elif looks_like_base64(value):
            data = _b64(value)
        else:
            path = Path(value.removeprefix("file://"))
            if not path.is_absolute() and base_dir is not None:
                path = Path(base_dir) / path
            if not path.is_file():
                raise ImageError(f"image file {str(path)!r} does not exist")
            data = path.read_bytes()
    elif isinstance(value, (bytes, bytearray)):
        data = bytes(value)
    else:
        raise ImageError(f"an image must be a path, base64 text, bytes or a {{bytes, path}} mapping, "
                         f"got {type(value).__name__}")
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except (UnidentifiedImageError, OSError) as exc:
        raise ImageError(f"cannot decode the image ({exc})") from None
    return img.convert("RGB")


#: base64 text: its alphabet only (line breaks allowed), at most two '=' of padding at the end
_BASE64 = re.compile(r"[A-Za-z0-9+/\s]+={0,2}\s*")


def looks_like_base64(text: str) -> bool:
    """Whether an image string is bare base64 rather than a path: at least 64 characters, all of
    the base64 alphabet (so no ``.`` of a file extension). JPEG's base64 starts with ``/9j/``,
    so a ``/`` alone does not make a path."""
    return len(text) >= 64 and _BASE64.fullmatch(text) is not None


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the image's base64 text does not decode") from None


class VisionProcessor:
    """Token ids and vision inputs of image prompts for one model directory.

    Args:
        path: the model directory (tokenizer, ``preprocessor_config.json``, ``config.json``).
        min_pixels, max_pixels: bounds of an image's area after resizing (None: the directory's).
        tokenizer: the tokenizer to use instead of loading the directory's.
    """

    def __init__(self, path: str | Path, min_pixels: int | None = None, max_pixels: int | None = None,
                 tokenizer: Any = None) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer

        self.path = Path(path)
        cfg = json.loads((self.path / "config.json").read_text(encoding="utf-8"))
        if cfg.get("model_type") not in VISION_MODEL_TYPES:
            raise ValueError(f"model {str(self.path)!r}: model_type {cfg.get('model_type')!r} is not a vision-language "
                             f"model rlweave lays out (supported: {', '.join(VISION_MODEL_TYPES)})")
        self.image_token_id = int(cfg["image_token_id"])
        self.merge = int(cfg["vision_config"]["spatial_merge_size"])
        self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(
            str(self.path), local_files_only=True)
        self.placeholder = self.tokenizer.convert_ids_to_tokens(self.image_token_id)
        kwargs: dict[str, Any] = {}
        if min_pixels is not None or max_pixels is not None:
            base = AutoImageProcessor.from_pretrained(str(self.path), local_files_only=True).size
            kwargs["size"] = {"shortest_edge": int(min_pixels or base["shortest_edge"]),
                              "longest_edge": int(max_pixels or base["longest_edge"])}
        import warnings

        with warnings.catch_warnings():  # "requires torchvision ... falling back to the PIL backend"
            warnings.simplefilter("ignore")
            self.images = AutoImageProcessor.from_pretrained(str(self.path), local_files_only=True, **kwargs)

    @classmethod
    def for_model(cls, path: str | Path, bounds: Any = None, tokenizer: Any = None) -> "VisionProcessor | None":
        """The processor of the model directory ``path`` when it is a vision-language model
        (:func:`is_vision_model`), else None; ``bounds``: the pixel bounds section (``model.vision``,
        with ``min_pixels``/``max_pixels``) or None."""
        if not is_vision_model(path):
            return None
        return cls(path, getattr(bounds, "min_pixels", None), getattr(bounds, "max_pixels", None), tokenizer=tokenizer)

    def count_placeholders(self, text: str) -> int:
        """How many image placeholders ``text`` holds."""
        return text.count(self.placeholder)

    def image_inputs(self, images: Sequence[Any]) -> dict[str, Any]:
        """:data:`MM_KEYS` tensors of PIL ``images`` (in order)."""
        import torch

        out = self.images(images=list(images), return_tensors="pt")
        return {"pixel_values": out["pixel_values"].to(torch.float32),
                "image_grid_thw": out["image_grid_thw"].to(torch.long)}

    def tokens_per_image(self, grid_thw) -> list[int]:
        """The number of placeholder tokens each image of ``image_grid_thw`` expands to."""
        return [int(t * h * w) // (self.merge ** 2) for t, h, w in grid_thw.tolist()]

    def encode(self, text: str, images: Sequence[Any]) -> tuple[list[int], dict[str, Any] | None]:
        """``(ids, mm)``: the token ids of ``text`` with each placeholder expanded to its image's
        tokens, and the vision inputs (None without images). ValueError when the number of
        placeholders differs from the number of images (:func:`expand_placeholders`)."""
        ids = list(self.tokenizer(text)["input_ids"])
        expanded, _, mm = expand_placeholders(self, ids, [0] * len(ids), images)
        return expanded, mm


def expand_placeholders(vision: VisionProcessor, ids: Sequence[int], mask: Sequence[int],
                        images: Sequence[Any]) -> tuple[list[int], list[int], dict[str, Any] | None]:
    """``(ids, mask, mm)``: token ids in which each single image placeholder token (as a text with
    placeholders tokenizes) is expanded to its image's tokens, mask 0 on them, and the vision inputs
    (None without images). ValueError when the placeholders and the images differ in number."""
    n = sum(1 for t in ids if t == vision.image_token_id)
    if n != len(images):
        raise ValueError(f"the text has {n} image placeholder(s) ({vision.placeholder}) but {len(images)} image(s) "
                         "were given")
    if not images:
        return list(ids), list(mask), None
    mm = vision.image_inputs(images)
    counts = iter(vision.tokens_per_image(mm["image_grid_thw"]))
    out_ids: list[int] = []
    out_mask: list[int] = []
    for t, m in zip(ids, mask):
        k = next(counts) if t == vision.image_token_id else 1
        out_ids += [t] * k
        out_mask += [m if k == 1 and t != vision.image_token_id else 0] * k
    return out_ids, out_mask, mm


def mrope_positions(input_ids, grid_thw, image_token_id: int, merge: int, with_mask: bool = False):
    """``(3, L)`` int64 rotary positions of one sequence ``input_ids`` ``(L,)`` whose images are
    laid out on their merged grids: the first run of ``image_token_id`` tokens is image 0 of
    ``grid_thw`` ``(images, 3)``, the next image 1, and so on (each run exactly as long as its
    image's tokens); image tokens past the last image (a model that sampled one) are text. Text
    tokens take the next position on all three rows; after an image the next position is its start
    plus the larger of its merged height and width (Qwen2-VL's rule). With ``with_mask``, also a
    bool ``(L,)`` mask of the tokens that are images. ValueError when the images' tokens are not
    where ``grid_thw`` says."""
    import torch

    ids = input_ids.reshape(-1)
    n = int(ids.numel())
    out = torch.empty((3, n), dtype=torch.long)
    mask = torch.zeros(n, dtype=torch.bool)
    is_img = (ids == image_token_id).tolist()
    grids = [] if grid_thw is None else grid_thw.tolist()
    pos, i, k = 0, 0, 0
    while i < n:
        if not is_img[i] or k >= len(grids):
            j = i + 1
            while j < n and (not is_img[j] or k >= len(grids)):
                j += 1
            out[:, i:j] = torch.arange(pos, pos + j - i)
            pos += j - i
            i = j
            continue
        t, h, w = grids[k]
        gh, gw = h // merge, w // merge
        count = t * gh * gw
        if i + count > n or not all(is_img[i:i + count]):
            raise ValueError(f"mrope_positions: image {k} needs {count} consecutive image tokens at {i}")
        tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij")
        out[0, i:i + count] = tt.reshape(-1) + pos
        out[1, i:i + count] = hh.reshape(-1) + pos
        out[2, i:i + count] = ww.reshape(-1) + pos
        mask[i:i + count] = True
        pos += max(gh, gw)
        i += count
        k += 1
    if k != len(grids):
        raise ValueError(f"mrope_positions: {len(grids)} image(s) given, {k} image-token run(s) found")
    return (out, mask) if with_mask else out
