"""Records with images: their two forms, the normalised ``images`` field, and reading the images.

A record carries images in one of two forms, each with any number of images:

* **chat**: ``messages`` (or a ``prompt`` given as a message list) whose ``content`` is a
  string or a list of parts: ``{"type": "text", "text": str}``, ``{"type": "image", "image":
  value}``, ``{"type": "image_url", "image_url": {"url": value}}`` (OpenAI's form), or
  ``{"type": "image"}`` without a value, which takes the next value of the record's ``images``
  list (TRL's form). In a record with ``images``, a string content holding ``<image>`` markers
  is split at them into text and image parts (verl's form).
* **plain**: a ``prompt`` (or ``query``) text holding the model's image placeholders (for the
  Qwen2-VL family ``<|vision_start|><|image_pad|><|vision_end|>``, as its chat template writes
  them) plus ``images``: a list of values, or one value.

An image value is a path (relative to the folder the data file, or the saved dataset
directory, is in), a ``file://`` URL, a ``data:`` URL, bare base64 text, bytes (parquet), or a
``{"bytes", "path"}`` mapping (parquet and ``datasets`` image columns); see
:func:`rlweave.data.vision.load_image`. Remote URLs are refused (nothing is downloaded).

Contracts:

* :func:`normalise_images` (called by the record loader, :mod:`rlweave.data.records`) gives a
  record with images the field ``images``: every image value of the record in the order of its
  placeholders, each a ``str`` (an absolute path, a ``data:`` URL or base64 text) or ``bytes``,
  so later readers need no base directory; a path must name an existing file. The image parts of its messages become
  ``{"type": "image"}`` (values moved into ``images``) and parts lose their null keys, so a chat
  template that renders TRL's form renders them, and normalising again changes nothing. A
  record without images is left exactly as it is. Images are not read here.
* Problems raise :class:`RecordImageError`, whose ``field`` names the record's field: an image
  part without a value when ``images`` has none left, ``images`` values no part takes, a value
  of the wrong type, a remote URL, a missing file, an image part outside the prompt.
* :func:`record_images` reads the images of a normalised record (``PIL.Image``, RGB, in
  order); :func:`image_field` names the field a record's images come from (for messages).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlweave.data.vision import REMOTE_SCHEMES, ImageError, load_image, looks_like_base64

#: content part types of a chat message
PART_TYPES = ("text", "image", "image_url")

#: image part types (their value: ``image``, ``image_url.url``, else the next of ``images``)
IMAGE_PARTS = ("image", "image_url")

#: the marker of an image inside a string content (verl's form; only in records with ``images``)
IMAGE_MARKER = "<image>"

#: message-list fields whose images are the prompt's, in the order they are looked at
PROMPT_MESSAGE_FIELDS = ("prompt", "messages")

#: message-list fields that may not hold images (the answers of preference records)
ANSWER_FIELDS = ("chosen", "rejected")


class RecordImageError(ValueError):
    """A record's images cannot be used; ``field`` is the record's field to name."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def parts_problem(parts: list[Any]) -> str | None:
    """Why a message content given as a list is not a list of content parts (None when it is):
    an empty list, a part that is not an object, an unknown ``type``, a text part without a
    ``text`` string, an ``image_url`` part without its ``url``. Values are checked by
    :func:`normalise_images`."""
    if not parts:
        return "the content part list is empty"
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            return f"part {j} is a {type(part).__name__}, not a {{type, ...}} object"
        kind = part.get("type")
        if kind not in PART_TYPES:
            return f"part {j} has type {kind!r}; the part types are {', '.join(PART_TYPES)}"
        if kind == "text" and not isinstance(part.get("text"), str):
            return f"part {j} (text) has no 'text' string"
        if kind == "image_url" and not isinstance(_url(part), str):
            return f"part {j} (image_url) needs 'image_url': {{'url': <image>}}"
    return None


def _url(part: dict[str, Any]) -> Any:
    url = part.get("image_url")
    return url.get("url") if isinstance(url, dict) else url


def _message_field(rec: dict[str, Any]) -> str | None:
    return next((k for k in PROMPT_MESSAGE_FIELDS if isinstance(rec.get(k), list)), None)


def image_field(rec: dict[str, Any]) -> str | None:
    """The field to name for a record's images: its prompt's message field (``prompt`` or
    ``messages``) when that holds image parts, else ``images`` when the record has it, else
    None (no images)."""
    field = _message_field(rec)
    if field is not None and any(_is_image(p) for m in rec[field] if isinstance(m, dict)
                                 for p in _parts(m.get("content"))):
        return field
    return "images" if rec.get("images") is not None else None


def _parts(content: Any) -> list[Any]:
    return content if isinstance(content, list) else []


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in IMAGE_PARTS


def _split_markers(content: str) -> list[dict[str, Any]]:
    """verl's form: ``"<image>What is it?"`` -> an image part and a text part."""
    parts: list[dict[str, Any]] = []
    for k, text in enumerate(re.split(re.escape(IMAGE_MARKER), content)):
        if k:
            parts.append({"type": "image"})
        if text:
            parts.append({"type": "text", "text": text})
    return parts


def normalise_images(rec: dict[str, Any], base_dir: str | Path | None) -> None:
    """Give ``rec`` its normalised ``images`` (see the module docstring), in place; relative
    paths are taken from ``base_dir`` (None: the current directory). Raises
    :class:`RecordImageError`."""
    given = rec.get("images")
    listed = [k for k in (*PROMPT_MESSAGE_FIELDS, *ANSWER_FIELDS) if isinstance(rec.get(k), list)]
    if given is None and not any(isinstance(m, dict) and isinstance(m.get("content"), list)
                                 for k in listed for m in rec[k]):
        return  # a text-only record stays exactly as it is
    pool = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
    field = _message_field(rec)
    for other in listed:
        if other != field:
            _tidy_messages(rec, other, pool=None)
    found = _tidy_messages(rec, field, pool) if field is not None else [(v, "images") for v in pool]
    if found or given is not None:
        rec["images"] = [_normal_value(v, base_dir, name, k) for k, (v, name) in enumerate(found)]


def _tidy_messages(rec: dict[str, Any], field: str, pool: list[Any] | None) -> list[tuple[Any, str]]:
    """``(value, field it came from)`` of each image of ``rec[field]``'s messages in order (bare
    image parts take theirs from ``pool``), rewriting the messages' parts; ``pool`` None: the
    field may hold no image."""
    messages, found, used = [], [], 0
    for i, msg in enumerate(rec[field]):
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, str) and pool is not None and IMAGE_MARKER in content and rec.get("images") is not None:
            content = _split_markers(content)
        if not isinstance(content, list):
            messages.append(msg)
            continue
        parts = []
        for j, part in enumerate(content):
            part = {k: v for k, v in part.items() if v is not None}
            if not _is_image(part):
                parts.append(part)
                continue
            if pool is None:
                raise RecordImageError(field, f"message {i} part {j}: an image outside the prompt; images are read "
                                       f"from the prompt's messages ({' or '.join(PROMPT_MESSAGE_FIELDS)}) only")
            value = part.get("image") if part["type"] == "image" else _url(part)
            if value is not None:
                found.append((value, field))
            elif used < len(pool):
                found.append((pool[used], "images"))
                used += 1
            else:
                raise RecordImageError(field, f"message {i} part {j}: an image part without a value, and the "
                                       f"record's 'images' has no value left for it ({len(pool)} given)")
            parts.append({"type": "image"})
        messages.append({**msg, "content": parts})
    if pool is not None and used < len(pool):
        raise RecordImageError("images", f"{len(pool)} image(s) given but '{field}' has {used} image part(s) "
                               "without a value to take them: put a {\"type\": \"image\"} part where each image "
                               "goes")
    rec[field] = messages
    return found


def _normal_value(value: Any, base_dir: str | Path | None, field: str, k: int) -> Any:
    """One image value as stored in the normalised ``images``."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return _normal_value(value["bytes"], base_dir, field, k)
        if value.get("path"):
            return _normal_value(value["path"], base_dir, field, k)
        raise RecordImageError(field, f"image {k}: a mapping needs 'bytes' or 'path' (has {sorted(value)})")
    if isinstance(value, str):
        if not value:
            raise RecordImageError(field, f"image {k}: an empty string")
        if value.startswith(REMOTE_SCHEMES):
            raise RecordImageError(field, f"image {k}: {value[:60]!r} is a remote URL; images are not downloaded: "
                                   "download it and give its path (or its bytes or base64)")
        if value.startswith("data:") or looks_like_base64(value):
            return value
        given = Path(value.removeprefix("file://")).expanduser()
        path = given if given.is_absolute() else Path(base_dir or ".").absolute() / given
        if not path.is_file():
            how = "" if given.is_absolute() else f" ({value!r} is taken from the data file's folder)"
            raise RecordImageError(field, f"image {k}: image file '{path}' does not exist{how}")
        return str(path)
    if type(value).__module__.startswith("PIL."):
        return value  # an image decoded by the reader; read as it is
    raise RecordImageError(field, f"image {k}: expected a path, base64 text, bytes or a {{bytes, path}} mapping, got "
                           f"{type(value).__name__}")


def read_image(value: Any) -> Any:
    """One value of a normalised ``images`` as an RGB ``PIL.Image`` (an image decoded by the reader
    as it is, else :func:`~rlweave.data.vision.load_image`); raises ImageError."""
    return value.convert("RGB") if hasattr(value, "convert") else load_image(value)


def record_images(rec: dict[str, Any]) -> list[Any]:
    """The images of a record normalised by the loader (its ``images``), read as RGB
    ``PIL.Image`` in placeholder order; ``[]`` for a record without images. Raises
    :class:`~rlweave.data.vision.ImageError` naming the record, the field and the image."""
    out = []
    for k, value in enumerate(rec.get("images") or []):
        try:
            out.append(read_image(value))
        except ImageError as exc:
            raise ImageError(f"record {rec.get('id', '?')}: field 'images': image {k}: {exc}") from None
    return out
