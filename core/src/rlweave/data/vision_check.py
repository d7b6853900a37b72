"""Checking one loaded record against a vision-language model, as its prompt will be encoded.

:func:`record_problem` takes a record loaded by :mod:`rlweave.data.records` (its ``images``
normalised) and the model's :class:`~rlweave.data.vision.VisionProcessor`, and returns the
first problem, as ``"field '<field>': <what>"``, or None:

* an image that cannot be read (:func:`rlweave.data.vision_records.read_image`);
* a prompt whose image placeholders differ in number from the record's images (the prompt is
  the ``prompt``/``query`` text, else the chat messages rendered with the chat template: a
  template that does not render image parts shows up here);
* a prompt with images that, each image's tokens expanded, is not shorter than the limit given
  (a text-only prompt is left to the engine's long-prompt policy, as before; truncating a prompt
  with images would cut its image tokens).

Used by ``rlweave validate`` on the head of each data file (:mod:`rlweave.config.vision_inputs`);
imports PIL and transformers only through the processor.
"""

from __future__ import annotations

from typing import Any

from rlweave.data.chat import ChatRenderer, NoChatTemplate
from rlweave.data.vision import ImageError
from rlweave.data.vision_records import PROMPT_MESSAGE_FIELDS, image_field, read_image


def prompt_text(rec: dict[str, Any], renderer: ChatRenderer) -> tuple[str, str, bool] | None:
    """``(field, text, rendered)`` of a record's prompt as the rollout encodes it: ``prompt`` or
    ``query`` text, else the first message list of :data:`PROMPT_MESSAGE_FIELDS` rendered with
    the chat template (without a last assistant turn, with the generation prompt); None without
    a prompt or a template (the data checks report those)."""
    for field in ("prompt", "query"):
        if isinstance(rec.get(field), str):
            return field, rec[field], False
    for field in PROMPT_MESSAGE_FIELDS:
        if isinstance(rec.get(field), list):
            try:
                return field, renderer.prompt(rec[field]), True
            except NoChatTemplate:
                return None
    return None


def record_problem(rec: dict[str, Any], processor: Any, limit: tuple[int, str], chat_template: str | None = None,
                   bounds_key: str = "model.vision") -> str | None:
    """The first problem of ``rec`` for ``processor`` (see the module docstring); ``limit`` is
    ``(tokens, what it is)``, ``bounds_key`` the config key of the pixel bounds, named in the
    hint of a prompt that is too long."""
    values = rec.get("images") or []
    field = image_field(rec) or "images"
    images = []
    for k, value in enumerate(values):
        try:
            images.append(read_image(value))
        except ImageError as exc:
            return f"field '{field}': image {k}: {exc}"
    found = prompt_text(rec, ChatRenderer(processor.tokenizer, chat_template))
    if found is None:
        return None
    text_field, text, rendered = found
    count = processor.count_placeholders(text)
    if count != len(images):
        if rendered:
            return (f"field '{text_field}': the chat template renders {count} image placeholder(s) "
                    f"({processor.placeholder}) but the record has {len(images)} image(s): give each image its "
                    "{\"type\": \"image\"} part, and use a chat template that renders image parts")
        where = "no 'images'" if not values else f"{len(images)} image(s) in 'images'"
        return (f"field '{text_field}': {count} image placeholder(s) ({processor.placeholder}) but {where}: the "
                "text needs one placeholder where each image goes")
    try:
        ids, _ = processor.encode(text, images)
    except Exception as exc:  # noqa: BLE001 - the image processor's own errors (e.g. a 1-pixel image)
        return f"field '{field}': the images cannot be processed: {type(exc).__name__}: {exc}"
    tokens, what = limit
    if images and len(ids) >= tokens:
        return (f"field '{text_field}': the prompt is {len(ids)} tokens with its {len(images)} image(s) expanded, "
                f"not fewer than {what}, which leaves no room for a response: lower {bounds_key}.max_pixels, use "
                "fewer or smaller images or a shorter text, or raise the limit")
    return None
