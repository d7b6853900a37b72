"""Data records: read with stable ids from jsonl, parquet or saved datasets, and checked.

Contracts:

* :func:`load_records` / :class:`RecordDataset` read every record of a data file: jsonl (one
  JSON object per non-blank line), parquet, or a directory written by ``datasets``'
  ``Dataset.save_to_disk`` (:mod:`rlweave.data.formats`). Each record gets a stable
  string ``"id"``: its own ``"id"`` field when present, else ``"<file stem>:<line number>"``
  (jsonl, 1-based) or ``"<stem>:<row index>"`` (parquet and datasets, 0-based).
* Records in chat form (``messages``: a list of ``{role, content}``; or a ``prompt`` given as
  such a list) are checked and, when a tokenizer is given, get their ``prompt`` rendered with
  its chat template or ``chat_template`` (:mod:`rlweave.data.chat`); without a template that
  is an error saying so.
* Records with images (image parts in their messages, or an ``images`` field) get the
  normalised ``images`` field of :mod:`rlweave.data.vision_records`: every image value in
  placeholder order, relative paths made absolute against the folder the data file (or saved
  dataset directory) is in; their image parts become ``{"type": "image"}``, which the chat
  template renders. Text-only records are left as they are.
* Every problem raises :class:`~rlweave.data.formats.DataError` (a ``ValueError``), one
  line naming the file, the record (``line N`` / ``row N``) and the field: bad JSON, a record
  that is not an object, a missing ``required`` field, none of ``require_any``, a malformed
  ``messages`` or ``prompt``, a message part or image value that cannot be used, a duplicate
  id, an empty file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rlweave.data.chat import MESSAGE_FIELDS, ChatRenderer, NoChatTemplate, message_problem
from rlweave.data.formats import DataError, default_id, iter_rows
from rlweave.data.vision_records import RecordImageError, normalise_images

__all__ = ["TEXT_FIELDS", "DataError", "JsonlDataset", "RecordDataset", "chat_field", "iter_records", "load_records",
           "open_split"]

#: fields that carry the text a record is about (a run's records need one of them)
TEXT_FIELDS = ("prompt", "query", "messages", "chosen")


def _check_record(rec: Any, where: str, required: tuple[str, ...], require_any: tuple[str, ...]) -> None:
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    missing = [k for k in required if k not in rec]
    if missing:
        names = ", ".join(f"'{k}'" for k in missing)
        raise DataError(f"{where}: missing field{'s' if len(missing) > 1 else ''} {names} (has {sorted(rec)})")
    if require_any and not any(k in rec for k in require_any):
        raise DataError(f"{where}: none of the fields {', '.join(require_any)} (has {sorted(rec)})")
    for key in MESSAGE_FIELDS:  # "messages" always; the others when given as a list
        if key in rec and (key == "messages" or isinstance(rec[key], list)):
            problem = message_problem(rec[key])
            if problem:
                raise DataError(f"{where}: field '{key}': {problem}")
    for key, allowed in (("prompt", (str, list)), ("query", (str,))):
        if key in rec and not isinstance(rec[key], allowed):
            kinds = "a string or a message list" if len(allowed) > 1 else "a string"
            raise DataError(f"{where}: field '{key}': expected {kinds}, got {type(rec[key]).__name__}")


def chat_field(rec: dict[str, Any]) -> str | None:
    """The field whose messages the loader renders into ``prompt`` (None: nothing to render):
    ``messages`` of a record without ``prompt``, or a ``prompt`` given as a message list outside
    preference records (``chosen``/``rejected``: the algorithm renders those itself)."""
    if isinstance(rec.get("prompt"), list) and "chosen" not in rec and "rejected" not in rec:
        return "prompt"
    if "messages" in rec and "prompt" not in rec:
        return "messages"
    return None


def _render(rec: dict[str, Any], where: str, chat: ChatRenderer) -> None:
    """Set ``prompt`` of a chat record to its rendered text (see :mod:`rlweave.data.chat`)."""
    field = chat_field(rec)
    if field is None:
        return
    try:
        rec["prompt"] = chat.prompt(rec[field])
    except NoChatTemplate as exc:
        raise DataError(f"{where}: field '{field}': {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a template error (jinja) names the record
        raise DataError(f"{where}: field '{field}': the chat template fails: {type(exc).__name__}: {exc}") from None


def iter_records(path: str | Path, *, tokenizer: Any = None, chat_template: str | None = None,
                 required: Iterable[str] = (), require_any: Iterable[str] = (),
                 limit: int | None = None, fmt: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(location, record)`` of each record as :func:`load_records` returns them, location
    being ``"line N"`` or ``"row N"``; an empty file yields nothing (no error)."""
    path = Path(path)
    required, require_any = tuple(required), tuple(require_any)
    chat = ChatRenderer(tokenizer, chat_template) if tokenizer is not None else None
    first: dict[str, str] = {}
    base_dir = path.absolute().parent
    for location, rec in iter_rows(path, fmt=fmt, limit=limit):
        where = f"{path} {location}"
        _check_record(rec, where, required, require_any)
        rid = str(rec["id"]) if rec.get("id") is not None else default_id(path, location)
        if rid in first:
            raise DataError(f"{where}: duplicate id {rid!r} (first at {first[rid]})")
        first[rid] = location
        rec["id"] = rid
        try:
            normalise_images(rec, base_dir)
        except RecordImageError as exc:
            raise DataError(f"{where}: field '{exc.field}': {exc}") from None
        if chat is not None:
            _render(rec, where, chat)
        yield location, rec


def load_records(path: str | Path, **kwargs: Any) -> list[dict[str, Any]]:
    """Every record of ``path``, checked, with ids, chat prompts rendered when ``tokenizer`` is
    given (see the module docstring); keyword arguments as :func:`iter_records`. Raises
    :class:`DataError` (also for a file without records) or ``FileNotFoundError``."""
    records = [rec for _, rec in iter_records(path, **kwargs)]
    if not records:
        raise DataError(f"{path}: no records")
    return records


class RecordDataset:
    """Records of a data file, each with a stable ``"id"`` (see :func:`load_records`, whose
    keyword arguments it takes)."""

    def __init__(self, path: str | Path, required: Iterable[str] = (), **kwargs: Any) -> None:
        self.path = Path(path)
        self.records: list[dict[str, Any]] = load_records(self.path, required=required, **kwargs)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.records[i]

    def __iter__(self):
        return iter(self.records)

    def head(self, k: int | None) -> list[dict[str, Any]]:
        """The first ``k`` records (all when ``k`` is None), e.g. ``data.eval_size``."""
        return self.records if k is None else self.records[:k]


#: the name older callers use; it reads every format :func:`load_records` reads
JsonlDataset = RecordDataset


def open_split(data: Any, split: str, tokenizer: Any = None) -> RecordDataset | None:
    """The dataset of ``data.<split>`` (``"train"`` or ``"eval"``) of a config's ``data``
    section, chat prompts rendered with ``tokenizer`` and ``data.chat_template``; None when
    the split is not configured. A run's records need one of :data:`TEXT_FIELDS`."""
    path = getattr(data, split)
    if not path:
        return None
    return RecordDataset(path, require_any=TEXT_FIELDS, tokenizer=tokenizer,
                         chat_template=getattr(data, "chat_template", None))
