"""Token ids of chat messages for multi-turn rollouts, without ever re-tokenising model tokens.

A trajectory is ``prompt ids + model turn + observation + model turn + ...``: the prompt ids are
the chat template's rendering of the opening messages with the assistant header
(:func:`prompt_ids`); a model turn is the tokens the engine sampled, kept as they are; an
observation is the text the template puts between the end of a model turn and the header of the
next one (the turn's end-of-message suffix, the observation messages, the next assistant header),
tokenised on its own (:func:`observation_ids`).

With a tokenizer that has no chat template, messages are rendered as plain lines
``"<role>: <content>\\n"`` followed by ``"assistant: "``.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

_MARK = "\x1fend-of-probe\x1f"  # a content no template writes on its own
_PROBE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]


def has_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _plain(messages: Sequence[dict[str, Any]]) -> str:
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render(tokenizer: Any, messages: Sequence[dict[str, Any]], generation_prompt: bool = True,
           tools: Sequence[dict[str, Any]] | None = None) -> str:
    """The chat template's text of ``messages`` (with the assistant header when
    ``generation_prompt``; ``tools``: the OpenAI tool schemas the template lists, if it does)."""
    if not has_template(tokenizer):
        return _plain(messages) + ("assistant: " if generation_prompt else "")
    kw = {"tools": list(tools)} if tools else {}
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt, **kw)


def prompt_ids(tokenizer: Any, messages: Sequence[dict[str, Any]],
               tools: Sequence[dict[str, Any]] | None = None) -> tuple[list[int], str]:
    """``(ids, text)`` of the opening messages and the assistant header the model continues."""
    if has_template(tokenizer):
        text = render(tokenizer, messages, True, tools)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]), text
    text = _plain(messages) + "assistant: "
    return list(tokenizer(text)["input_ids"]), text


def observation_text(tokenizer: Any, messages: Sequence[dict[str, Any]], stopped: bool,
                     stop_text: str | None = None, tools: Sequence[dict[str, Any]] | None = None) -> str:
    """The text between the end of a model turn and the next model turn: what the template writes
    after the turn's last token (when the turn ``stopped`` on the end-of-message token the template
    writes, the rest of that suffix; else, also when it stopped on another stop token such as a
    generation config's ``<|endoftext|>``, the whole end of the message), then ``messages``, then
    the assistant header. ``stop_text``: the text of the token the turn stopped on (None: the
    tokenizer's EOS token); ``tools``: as for :func:`render`.
    Raises ValueError when the template does not render a conversation as a prefix of its
    continuation (then observations cannot be appended token-exactly)."""
    if not has_template(tokenizer):
        return ("" if stopped else "\n") + _plain(messages) + "assistant: "
    before = render(tokenizer, _PROBE, False, tools)
    after = render(tokenizer, _PROBE + list(messages), True, tools)
    if not after.startswith(before):
        raise ValueError("the tokenizer's chat template does not render a conversation as a prefix of its "
                         "continuation; multi-turn observations cannot be appended token-exactly")
    end = before[before.rindex(_MARK) + len(_MARK):]  # what the template writes after an assistant message
    stop = stop_text if stop_text is not None else getattr(tokenizer, "eos_token", None)
    if stopped and stop and stop in end:  # the model's own stop token already ends the turn
        end = end[end.index(stop) + len(stop):]
    return end + after[len(before):]


def observation_ids(tokenizer: Any, messages: Sequence[dict[str, Any]], stopped: bool,
                    stop_text: str | None = None, tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
    """Token ids of :func:`observation_text`, tokenised on their own."""
    return _encode(tokenizer, observation_text(tokenizer, messages, stopped, stop_text, tools))


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens added."""
    return _encode(tokenizer, text)
