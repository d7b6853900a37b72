"""Preference records -> token ids.

Accepted records (one jsonl line each, with a stable ``id`` from the data loader):

* text: ``{"prompt": str, "chosen": str, "rejected": str}``;
* chat: ``{"prompt": [messages], "chosen": [messages], "rejected": [messages]}`` (TRL's
  conversational form: the prompt turns, then the assistant turn(s) of each answer), or
  ``{"chosen": [messages], "rejected": [messages]}`` whose shared leading turns are the
  prompt; a ``prompt`` may also be a string with chat-format answers.

Chat prompts are rendered with the tokenizer's chat template (``add_generation_prompt``)
exactly as evaluation renders them (``rlweave.algo_helpers.rollout.record_prompt``); an answer is
the text the template adds after that prompt. Prompts are tokenized alone (as at
generation time) and answers on their own, followed by EOS unless already there, so the
trained tokens are the ones the model must generate.
"""

from __future__ import annotations

from typing import Any, Sequence

from rlweave.algo_helpers.rollout import encode_prompts, record_prompt


def _is_messages(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(m, dict) and "role" in m for m in x)


def _render_answer(prompt_msgs: list[dict], answer_msgs: list[dict], prompt_text: str, tokenizer: Any, rid: Any) -> str:
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        full = tokenizer.apply_chat_template(prompt_msgs + answer_msgs, tokenize=False)
        if not full.startswith(prompt_text):
            raise ValueError(f"preference record {rid}: the chat template renders the prompt differently inside "
                             "the full conversation; use text prompts/answers")
        return full[len(prompt_text):]
    return "".join(str(m["content"]) for m in answer_msgs)


def preference_texts(record: dict[str, Any], tokenizer: Any = None) -> tuple[str, str, str]:
    """``(prompt_text, chosen_text, rejected_text)`` of one record; ``ValueError`` naming the
    record id when fields are missing or malformed."""
    rid = record.get("id", "?")
    if "chosen" not in record or "rejected" not in record:
        raise ValueError(f"preference record {rid}: needs 'chosen' and 'rejected' (has {sorted(record)})")
    chosen, rejected = record["chosen"], record["rejected"]
    if isinstance(chosen, str) and isinstance(rejected, str):
        if "prompt" not in record:
            raise ValueError(f"preference record {rid}: text answers need a 'prompt'")
        prompt = record["prompt"]
        text = record_prompt({"messages": prompt}, tokenizer) if _is_messages(prompt) else str(prompt)
        return text, chosen, rejected
    if not (_is_messages(chosen) and _is_messages(rejected)):
        raise ValueError(f"preference record {rid}: 'chosen'/'rejected' must both be strings or both message lists")
    prompt = record.get("prompt")
    if prompt is None:  # shared leading turns are the prompt
        k = 0
        while k < min(len(chosen), len(rejected)) - 1 and chosen[k] == rejected[k]:
            k += 1
        prompt_msgs, chosen, rejected = list(chosen[:k]), list(chosen[k:]), list(rejected[k:])
        if not prompt_msgs:
            raise ValueError(f"preference record {rid}: chosen and rejected share no prompt turn")
    elif _is_messages(prompt):
        prompt_msgs = list(prompt)
    else:
        prompt_msgs = [{"role": "user", "content": str(prompt)}]
    if not chosen or not rejected or chosen[0].get("role") != "assistant" or rejected[0].get("role") != "assistant":
        raise ValueError(f"preference record {rid}: the answers must start with an assistant turn")
    text = record_prompt({"messages": prompt_msgs}, tokenizer)
    return (text, _render_answer(prompt_msgs, chosen, text, tokenizer, rid),
            _render_answer(prompt_msgs, rejected, text, tokenizer, rid))


def encode_answer(tokenizer: Any, text: str) -> list[int]:
    """Answer token ids (no BOS) ending with EOS (added unless already last)."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
    return ids


def encode_preferences(
    records: Sequence[dict[str, Any]], tokenizer: Any, max_prompt_tokens: int = 512, max_response_tokens: int = 512
) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Prompt, chosen and rejected token ids of each record (prompts cut on the left,
    answers on the right)."""
    texts = [preference_texts(r, tokenizer) for r in records]
    prompts = encode_prompts(tokenizer, [t[0] for t in texts])
    prompts = [p[-max_prompt_tokens:] for p in prompts]
    chosen = [encode_answer(tokenizer, t[1])[:max_response_tokens] for t in texts]
    rejected = [encode_answer(tokenizer, t[2])[:max_response_tokens] for t in texts]
    return prompts, chosen, rejected
