"""Held-out exact-match evaluation: greedy generation, then a reward decides what is correct.

Works with anything that generates: a rollout :class:`~rlweave.scheduler.RoleHandle`
(``generate`` returns a future) or a local generator whose ``generate`` returns the list
directly (:class:`rlweave.algo_helpers.local_generate.LocalHFGenerator`). Never trains.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from rlweave.algo_helpers.rollout import encode_prompts
from rlweave.interfaces.engine import SamplingParams
from rlweave.rewards.failures import RewardFailureError
from rlweave.rewards.fields import reward_fields  # noqa: F401 - re-exported: algorithms import it from here


def record_prompt(record: dict[str, Any], tokenizer: Any = None) -> str:
    """The prompt text of a record: ``prompt``, else ``query``, else the chat ``messages``
    without the last assistant turn, rendered with the tokenizer's chat template."""
    if "prompt" in record:
        return str(record["prompt"])
    if "query" in record:
        return str(record["query"])
    if "messages" in record:
        msgs = list(record["messages"])
        if msgs and msgs[-1].get("role") == "assistant":
            msgs = msgs[:-1]
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant: "
    raise ValueError(f"record {record.get('id', '?')}: no 'prompt', 'query' or 'messages' field")


def encode_records(tokenizer: Any, records: Sequence[dict[str, Any]]) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """Prompt token ids of ``records`` (:func:`record_prompt`, then
    :func:`~rlweave.algo_helpers.rollout.encode_prompts`) and the meta each sample carries to
    the rewards: the prompt text and the record's reward fields."""
    texts = [record_prompt(r, tokenizer) for r in records]
    return encode_prompts(tokenizer, texts), [{"prompt": t, **reward_fields(r)} for t, r in zip(texts, records)]


def _result(x: Any) -> Any:
    return x.result() if hasattr(x, "result") else x


def exact_match(
    rollout: Any,
    tokenizer: Any,
    records: Sequence[dict[str, Any]],
    reward_fn: Any,
    max_new_tokens: int = 32,
    threshold: float = 1.0,
    greedy: bool = True,
    temperature: float = 1.0,
    seed: int = 0,
    episodes: Any = None,
) -> dict[str, float]:
    """Generate one answer per record and score it.

    ``episodes``: a :class:`~rlweave.algo_helpers.multi_turn.MultiTurnRollout`: each record is one
    episode (``max_new_tokens`` per model turn) and its last model turn is the answer scored;
    ``tool_used_frac`` is added (episodes with a tool call).

    ``reward_fn`` is either a reward set (has ``score(samples) -> (totals, breakdown)``,
    e.g. :class:`rlweave.rewards.RewardSet`) or a rule ``fn(prompt, response, **fields)``.
    A sample is correct when its reward is ``>= threshold``. Returns ``accuracy`` (fraction
    correct), ``reward_mean``, ``response_len`` (mean tokens), ``n`` and ``time_s``.

    When the reward set stops on failing rewards (:class:`~rlweave.rewards.RewardFailureError`,
    e.g. the held-out records lack a field the reward needs), the error is raised again with
    ``held-out evaluation`` in front: an accuracy over failed reward calls is no measurement.
    """
    t0 = time.perf_counter()
    if not records:
        return {"accuracy": 0.0, "reward_mean": 0.0, "response_len": 0.0, "n": 0.0, "time_s": 0.0}
    eos = getattr(tokenizer, "eos_token_id", None)
    params = SamplingParams(
        n=1,
        temperature=0.0 if greedy else temperature,
        max_new_tokens=max_new_tokens,
        stop_token_ids=[eos] if eos is not None else [],
        seed=seed,
    )
    extra: dict[str, float] = {}
    if episodes is not None:
        trajs = [g[0] for g in episodes.run(records, 1, params, lambda p, s: _result(rollout.generate(p, s)))]
        texts = [t.prompt_text for t in trajs]
        answers = [t.final_ids for t in trajs]
        lengths = [len(t.ids) for t in trajs]
        extra["tool_used_frac"] = sum(t.stats.get("tool_calls", 0.0) > 0 for t in trajs) / len(trajs)
    else:
        texts = [record_prompt(r, tokenizer) for r in records]
        gens = _result(rollout.generate(encode_prompts(tokenizer, texts), params))
        answers = [g[0].token_ids for g in gens]
        lengths = [len(a) for a in answers]
    responses = [tokenizer.decode(a, skip_special_tokens=True) for a in answers]
    samples = [{"prompt": t, "response": resp, **reward_fields(r)} for t, resp, r in zip(texts, responses, records)]
    if hasattr(reward_fn, "score"):
        try:
            scores = list(reward_fn.score(samples)[0])
        except RewardFailureError as exc:
            raise RewardFailureError(f"held-out evaluation on {len(samples)} records: {exc}", exc.reward,
                                     exc.failed, exc.total, exc.first) from exc
    else:
        scores = [float(reward_fn(**s)) for s in samples]
    n = len(samples)
    return {
        "accuracy": sum(1.0 for s in scores if s >= threshold - 1e-9) / n,
        "reward_mean": sum(scores) / n,
        "response_len": sum(lengths) / n,
        "n": float(n),
        "time_s": time.perf_counter() - t0,
        **extra,
    }
