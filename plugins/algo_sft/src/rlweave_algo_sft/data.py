"""SFT records -> token ids with a loss mask.

Two record shapes:

* ``{"query": str, "response": str}``: the query is encoded like a rollout prompt
  (:func:`rlweave.algo_helpers.rollout.encode_prompts`), the response follows it, then EOS; only the
  response (and EOS) is trained.
* ``{"messages": [{"role", "content"}, ...]}``: rendered with the tokenizer's chat template
  when it has one (else ``"role: content\\n"`` lines); every assistant turn is trained, the
  rest is context.

A record with ``images`` (a vision-language model) is encoded the same way, then each image
placeholder is expanded to its image's tokens (never trained): :func:`expand_images`.
"""

from __future__ import annotations

from typing import Any

from rlweave.algo_helpers.rollout import encode_prompts


def _ids(tokenizer: Any, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def encode_query_response(
    tokenizer: Any, query: str, response: str, append_eos: bool = True
) -> tuple[list[int], list[int]]:
    """``(ids, mask)`` with mask 1 on the response tokens (and the appended EOS)."""
    prompt = encode_prompts(tokenizer, [query])[0]
    resp = _ids(tokenizer, response, False)
    eos = getattr(tokenizer, "eos_token_id", None)
    if append_eos and eos is not None and (not resp or resp[-1] != eos):
        resp = resp + [eos]
    return prompt + resp, [0] * len(prompt) + [1] * len(resp)


def _render_plain(messages: list[dict[str, str]], eos_text: str, add_generation_prompt: bool) -> str:
    out = ""
    for m in messages:
        out += f"{m['role']}: {m['content']}" + (eos_text if m["role"] == "assistant" else "") + "\n"
    return out + ("assistant: " if add_generation_prompt else "")


def encode_messages(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """``(ids, mask)`` with mask 1 on every assistant turn's tokens.

    Each assistant span is found by rendering the conversation up to that turn (with the
    generation prompt) and up to its end; a template whose renderings are not prefixes of
    one another raises ``ValueError``."""
    template = getattr(tokenizer, "chat_template", None)
    eos_text = str(getattr(tokenizer, "eos_token", "") or "")

    def render(msgs: list[dict[str, str]], gen: bool) -> list[int]:
        if template:
            text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            return _ids(tokenizer, text, False)
        return _ids(tokenizer, _render_plain(msgs, eos_text, gen), True)

    if not any(m.get("role") == "assistant" for m in messages):
        raise ValueError("chat record has no assistant message to train on")
    ids = render(messages, False)
    mask = [0] * len(ids)
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        start = len(render(messages[:i], True)) if i else 0
        upto = render(messages[: i + 1], False)
        if ids[: len(upto)] != upto:
            raise ValueError(f"chat template is not prefix-stable at message {i}; cannot locate the assistant turn")
        for t in range(start, len(upto)):
            mask[t] = 1
    return ids, mask


def expand_images(vision: Any, record: dict[str, Any], ids: list[int],
                  mask: list[int]) -> tuple[list[int], list[int], dict[str, Any] | None]:
    """``(ids, mask, mm)`` of a record with ``images`` (:func:`rlweave.data.vision.expand_placeholders`);
    ValueError naming the record when the model is not a vision-language model (``vision`` None) or
    the placeholders and images differ in number."""
    from rlweave.data.vision import expand_placeholders
    from rlweave.data.vision_records import record_images

    if vision is None:
        raise ValueError(f"sft record {record.get('id', '?')} has images, but the model is not a vision-language model")
    try:
        return expand_placeholders(vision, ids, mask, record_images(record))
    except ValueError as e:
        raise ValueError(f"sft record {record.get('id', '?')}: {e}") from e


def encode_record(tokenizer: Any, record: dict[str, Any], append_eos: bool = True) -> tuple[list[int], list[int]]:
    """Dispatch on the record shape; raises ``ValueError`` naming the record id."""
    try:
        if "messages" in record:
            return encode_messages(tokenizer, list(record["messages"]))
        if "query" in record and "response" in record:
            return encode_query_response(tokenizer, str(record["query"]), str(record["response"]), append_eos)
        if "prompt" in record and "response" in record:
            return encode_query_response(tokenizer, str(record["prompt"]), str(record["response"]), append_eos)
    except ValueError as e:
        raise ValueError(f"sft record {record.get('id', '?')}: {e}") from e
    raise ValueError(
        f"sft record {record.get('id', '?')}: expected 'query'+'response' or 'messages' fields, got {sorted(record)}"
    )
