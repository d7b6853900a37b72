"""Records in chat form: checking ``messages`` and rendering them with a chat template.

A chat record carries ``messages``: a list of ``{"role": str, "content": str}`` (TRL's
conversational form); a content may also be a list of text and image parts
(:mod:`rlweave.data.vision_records`). The data loader (:mod:`rlweave.data.records`) renders its prompt once,
with the tokenizer's chat template (or ``data.chat_template``) and the generation prompt:
``prompt`` becomes the conversation up to, not including, a last assistant turn. The
conversation itself stays in ``messages`` (SFT trains on its assistant turns). A ``prompt``
given as a message list is rendered the same way (except in preference records, whose
``chosen``/``rejected`` answers the algorithm renders together with it).

No chat template means no rendering: :class:`NoChatTemplate` says so instead of inventing a
format the model was never trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlweave.data.vision_records import parts_problem

#: fields that may hold a message list
MESSAGE_FIELDS = ("messages", "prompt", "chosen", "rejected")


class NoChatTemplate(ValueError):
    """The tokenizer has no chat template and none was configured."""


def message_problem(value: Any) -> str | None:
    """Why ``value`` is not a list of ``{role, content}`` messages (None when it is); a content
    is a string or a list of parts (:func:`~rlweave.data.vision_records.parts_problem`)."""
    if not isinstance(value, list):
        return f"expected a list of {{role, content}} messages, got {type(value).__name__}"
    if not value:
        return "the message list is empty"
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            return f"message {i} is a {type(m).__name__}, not a {{role, content}} object"
        for key in ("role", "content"):
            if m.get(key) is None:  # a null in a table column is a missing key
                return f"message {i} has no '{key}'"
            if key == "content" and isinstance(m[key], list):
                problem = parts_problem(m[key])
                if problem:
                    return f"message {i}: {problem}"
            elif not isinstance(m[key], str):
                return f"message {i}: '{key}' must be a string, got {type(m[key]).__name__}"
    return None


def read_template(value: str | None) -> str | None:
    """``data.chat_template``: the template text, or the content of the file it names."""
    if value and "{" not in value and Path(value).is_file():
        return Path(value).read_text(encoding="utf-8")
    return value


class ChatRenderer:
    """Renders prompts with ``template`` (else the tokenizer's own chat template).

    Args:
        tokenizer: a transformers tokenizer (anything with ``apply_chat_template``), or None.
        template: a Jinja chat template used instead of the tokenizer's.
    """

    def __init__(self, tokenizer: Any = None, template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = read_template(template)

    def available(self) -> bool:
        return self.tokenizer is not None and bool(self.template or getattr(self.tokenizer, "chat_template", None))

    def missing_reason(self) -> str:
        if self.tokenizer is None:
            return "no tokenizer was given to render chat messages with"
        name = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
        return (f"the tokenizer ({name}) has no chat template to render chat messages with: set data.chat_template "
                "(a Jinja template, or a .jinja file) or use a tokenizer that has one")

    def prompt(self, messages: list[dict[str, str]]) -> str:
        """The prompt text: ``messages`` without a last assistant turn, plus the generation prompt."""
        if not self.available():
            raise NoChatTemplate(self.missing_reason())
        msgs = list(messages)
        if msgs and msgs[-1].get("role") == "assistant":
            msgs = msgs[:-1]
        kwargs = {"chat_template": self.template} if self.template else {}
        return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kwargs)
