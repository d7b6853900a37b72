"""Prompt records for ``generate`` and ``eval``: the project's data loader, errors as one line.

Records come from :func:`rlweave.data.records.load_records`, as a run reads them: jsonl,
parquet or a saved ``datasets`` directory; a stable ``id`` (the record's own, else ``<file
stem>:<line or row number>``); chat records (``messages``, or a ``prompt`` given as a message
list) rendered into ``prompt`` with the tokenizer's chat template. Each record needs one of
:data:`PROMPT_FIELDS`; its prompt text is
:func:`rlweave.algo_helpers.rollout.record_prompt`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlweave.commands.errors import CommandError

#: a record holds its prompt in one of these
PROMPT_FIELDS = ("prompt", "query", "messages")


def load_records(path: Path, tokenizer: Any = None, chat_template: str | None = None,
                 option: str = "--data") -> list[dict[str, Any]]:
    """Every record of ``path``, each with a string ``id``; chat prompts rendered when
    ``tokenizer`` is given (without it, a cheap check of the file before any model loads).

    Raises :class:`CommandError` naming the file (and line, row or record) when the file is
    missing, a record is malformed or has no prompt field, an id repeats, or it is empty."""
    from rlweave.data.records import load_records

    try:
        return load_records(path, require_any=PROMPT_FIELDS, tokenizer=tokenizer, chat_template=chat_template)
    except FileNotFoundError as exc:
        raise CommandError(f"{option}: {exc}") from None
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def prompt_texts(records: list[dict[str, Any]], tokenizer: Any) -> list[str]:
    """The prompt text of each record (as a run's evaluation reads it)."""
    from rlweave.algo_helpers.rollout import record_prompt

    return [record_prompt(r, tokenizer) for r in records]


def encode_records(tokenizer: Any, texts: list[str], records: list[dict[str, Any]], data: Path,
                   vision: Any = None) -> list[list[int]]:
    """Token ids of each prompt (a :class:`~rlweave.interfaces.engine.VisionPrompt` for a record with
    images, through ``vision``); :class:`CommandError` naming the record of one that encodes to
    nothing, or whose images cannot be read or do not fit its placeholders."""
    from rlweave.algo_helpers.rollout import encode_prompts

    out = []
    for text, rec in zip(texts, records):
        try:
            out.append(_vision_prompt(vision, text, rec) if rec.get("images") else encode_prompts(tokenizer, [text])[0])
        except ValueError as exc:
            why = str(exc) if rec.get("images") else f"the prompt {text[:40]!r} encodes to no tokens"
            raise CommandError(f"{data}: record {rec['id']}: {why}") from None
    return out


def _vision_prompt(vision: Any, text: str, rec: dict[str, Any]) -> list[int]:
    from rlweave.data.vision_records import record_images
    from rlweave.interfaces.engine import VisionPrompt

    if vision is None:
        raise ValueError("the record has images, but the model is not a vision-language model")
    ids, mm = vision.encode(text, record_images(rec))
    return VisionPrompt(ids, mm)


def vision_processor(path: Path, tokenizer: Any, src: Any) -> Any:
    """The :class:`~rlweave.data.vision.VisionProcessor` of a vision-language model directory (the
    run's ``model.vision`` pixel bounds where the source is a run), else None."""
    from rlweave.data.vision import VisionProcessor

    bounds = getattr(getattr(getattr(src, "cfg", None), "model", None), "vision", None)
    return VisionProcessor.for_model(path, bounds, tokenizer)
