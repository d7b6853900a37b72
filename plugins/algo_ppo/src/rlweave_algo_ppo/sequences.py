"""Token sequences PPO builds besides the rollout batch: ptx batches (the reward models' view of a
rollout is :func:`rlweave.algo_helpers.reward_models.scoring_batch`)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rlweave.data.batch import Batch


def supervised_batch(tokenizer: Any, records: Sequence[dict[str, Any]], encode_prompt) -> Batch:
    """``{query|prompt, response}`` records -> prompt + response + EOS, loss on the response
    and EOS (``encode_prompt(texts) -> ids`` is the run's prompt encoder)."""
    texts = [str(r.get("query", r.get("prompt", ""))) for r in records]
    prompts = encode_prompt(tokenizer, texts)
    eos = getattr(tokenizer, "eos_token_id", None)
    seqs, plens = [], []
    for p, r in zip(prompts, records):
        if "response" not in r:
            raise ValueError(f"ptx record {r.get('id', '?')}: needs a 'response' field")
        resp = list(tokenizer(str(r["response"]), add_special_tokens=False)["input_ids"])
        seqs.append(list(p) + resp + ([eos] if eos is not None else []))
        plens.append(len(p))
    return Batch.from_sequences(seqs, ids=[f"ptx:{r.get('id', i)}" for i, r in enumerate(records)],
                                meta=[{} for _ in records], prompt_lens=plens)


def conform(extra: Batch, like: Batch) -> Batch:
    """``extra`` with exactly the token/sample fields of ``like`` (missing ones zero-filled,
    surplus ones dropped), so ``Batch.concat([like, extra])`` works."""
    out = Batch(cu_seqlens=extra.cu_seqlens, ids=list(extra.ids), meta=list(extra.meta))
    T, n = extra.num_tokens, len(extra)
    for k, v in like.token.items():
        out.token[k] = extra.token[k].to(v.dtype) if k in extra.token else torch.zeros((T, *v.shape[1:]), dtype=v.dtype)
    for k, v in like.sample.items():
        have = k in extra.sample
        out.sample[k] = extra.sample[k].to(v.dtype) if have else torch.zeros((n, *v.shape[1:]), dtype=v.dtype)
    return out
