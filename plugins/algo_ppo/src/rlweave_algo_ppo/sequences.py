"""Token sequences PPO builds besides the rollout batch: the reward models' view of a
rollout (response closed by EOS, as reward models are trained) and ptx batches."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from rlweave.data.batch import Batch


def scoring_batch(batch: Batch, eos_id: int | None) -> Batch:
    """Prompt + response of every sample, with exactly one EOS at the end (added when the
    response stopped at the length limit, kept when the engine already emitted it), so the
    reward model reads its score at an EOS token, as in reward-model training."""
    if eos_id is None:
        return batch
    seqs = []
    for s in batch.sequences():
        ids = s.tolist()
        if ids[-1] != eos_id:
            ids.append(eos_id)
        seqs.append(ids)
    return Batch.from_sequences(seqs, ids=batch.ids, meta=batch.meta, prompt_lens=batch.sample["prompt_len"].tolist())


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
