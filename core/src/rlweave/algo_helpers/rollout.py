"""From records to prompt token ids, from engine generations to a training :class:`Batch`, and
the default rollout (:class:`SingleTurnRollout`, see :mod:`rlweave.interfaces.rollout`).

Both SFT and RL algorithms go through :func:`encode_prompts`, so a prompt is tokenized the
same way when a model is fine-tuned on it and when the rollout engine is asked to continue it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from rlweave.data.batch import Batch
from rlweave.interfaces.engine import Generation, SamplingParams, prompt_images
from rlweave.interfaces.rollout import GenerateFn, Rollout, RolloutContext
from rlweave.rewards.fields import reward_fields


def reward_samples(tokenizer: Any, batch: Batch) -> list[dict[str, Any]]:
    """What the rule rewards score for each sample of a rollout batch: the prompt text, the
    decoded response (special tokens skipped; a multi-turn episode's last model turn) and the
    record's reward fields from ``meta``."""
    samples = []
    for m in batch.meta:
        fields = {k: v for k, v in m.items() if k not in ("prompt", "response_ids", "finish_reason", "episode")}
        text = tokenizer.decode(m["response_ids"], skip_special_tokens=True)
        samples.append({"prompt": m["prompt"], "response": text, **fields})
    return samples


def sampling_params(config: Any, tokenizer: Any, seed: int, ignore_eos: bool = False) -> SamplingParams:
    """Rollout sampling settings from an RL algorithm's config (``n_samples``, ``temperature``,
    ``top_p``, ``top_k``, ``max_new_tokens``), stopping at the tokenizer's EOS when it has one,
    unless ``ignore_eos`` (then every sample is ``max_new_tokens`` long: equal work, benchmarks),
    asking for the MoE routing with ``router_replay: r3``.
    ``seed`` is the caller's per-step seed, so every algorithm keeps its own seeding scheme."""
    eos = None if ignore_eos else getattr(tokenizer, "eos_token_id", None)
    return SamplingParams(
        n=config.n_samples,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        max_new_tokens=config.max_new_tokens,
        stop_token_ids=[eos] if eos is not None else [],
        seed=seed,
        ignore_eos=ignore_eos,
        return_routing=getattr(config, "router_replay", "none") == "r3",
    )


def encode_prompts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each prompt text, with the tokenizer's own special-token convention
    (a BOS where the tokenizer adds one, never an EOS), and one BOS only for a text that starts
    with the BOS itself (a chat template that writes it, as Llama 3's does: the ids then equal
    ``apply_chat_template(..., tokenize=True)``'s). Raises ``ValueError`` naming the prompt
    index when a prompt encodes to no token (nothing to condition on)."""
    out: list[list[int]] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    bos, bos_text = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "bos_token", None)
    for i, text in enumerate(texts):
        ids = list(tokenizer(text)["input_ids"])
        if bos is not None and bos_text and text.startswith(str(bos_text)) and ids[:2] == [bos, bos]:
            ids = ids[1:]  # the text's own BOS, and the one the tokenizer added in front of it
        if eos is not None and len(ids) > 1 and ids[-1] == eos and not text.endswith(str(tokenizer.eos_token)):
            ids = ids[:-1]  # tokenizers that append EOS: the prompt must stay open
        if not ids:
            raise ValueError(f"prompt #{i} ({text[:40]!r}) encodes to no tokens")
        out.append(ids)
    return out


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


def encode_records(tokenizer: Any, records: Sequence[dict[str, Any]],
                   vision: Any = None) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """Prompt token ids of ``records`` (:func:`record_prompt`, then
    :func:`~rlweave.algo_helpers.rollout.encode_prompts`) and the meta each sample carries to
    the rewards: the prompt text and the record's reward fields. With ``vision`` (a
    :class:`~rlweave.data.vision.VisionProcessor`), a record with ``images`` becomes a
    :class:`~rlweave.interfaces.engine.VisionPrompt` (its placeholders expanded); records with
    images without it raise ValueError naming the record."""
    texts = [record_prompt(r, tokenizer) for r in records]
    meta = [{"prompt": t, **reward_fields(r)} for t, r in zip(texts, records)]
    if not any(r.get("images") for r in records):
        return encode_prompts(tokenizer, texts), meta
    if vision is None:
        bad = next(r for r in records if r.get("images"))
        raise ValueError(f"record {bad.get('id', '?')} has images, but the model is not a vision-language model")
    from rlweave.data.vision_records import record_images
    from rlweave.interfaces.engine import VisionPrompt

    out: list[list[int]] = []
    for t, r in zip(texts, records):
        ids, mm = vision.encode(t, record_images(r))
        out.append(VisionPrompt(ids, mm) if mm is not None else ids)
    return out, meta


def generations_to_batch(
    prompt_ids: Sequence[Sequence[int]],
    gens: Sequence[Sequence[Generation]],
    ids: Sequence[str],
    meta: Sequence[dict[str, Any]],
    version: int | None = None,
) -> Batch:
    """One packed sample per generation, prompt-major (prompt 0's samples first).

    Token fields: ``input_ids`` (prompt + response), ``loss_mask`` (1 on response tokens),
    ``rollout_logprobs`` (the engine's log-prob of each response token under the
    prediction convention, 0 on the prompt), ``weight_version`` (the engine's weight version
    that generated each response token, 0 on the prompt: ``Generation.versions``, or
    ``version`` for generations the engine did not stamp; left out when neither says),
    ``routing`` where the engine reported it (``Generation.routing``).
    Sample fields: ``prompt_len``,
    ``response_len``, ``group`` (the prompt's index). Sample ids are ``f"{id}/{k}"``;
    ``meta`` is a copy of the prompt's meta plus ``response_ids`` and ``finish_reason``; ``mm``
    the vision inputs of prompts that carry images (:class:`~rlweave.interfaces.engine.VisionPrompt`).
    """
    if not (len(prompt_ids) == len(gens) == len(ids) == len(meta)):
        raise ValueError(
            f"generations_to_batch: {len(prompt_ids)} prompts, {len(gens)} generation lists, "
            f"{len(ids)} ids, {len(meta)} meta entries; they must match"
        )
    seqs: list[list[int]] = []
    plens: list[int] = []
    rlens: list[int] = []
    groups: list[int] = []
    sids: list[str] = []
    metas: list[dict[str, Any]] = []
    lps: list[float] = []  # flat, one entry per token: 0 on the prompt
    vers: list[int] | None = []  # likewise; None once a generation has no version
    for g, (p, glist, pid, m) in enumerate(zip(prompt_ids, gens, ids, meta)):
        p = list(p)
        zeros = [0.0] * len(p)
        for k, gen in enumerate(glist):
            resp = list(gen.token_ids)
            if len(gen.logprobs) != len(resp):
                raise ValueError(f"generation {pid}/{k}: {len(resp)} tokens but {len(gen.logprobs)} logprobs")
            seqs.append(p + resp)
            plens.append(len(p))
            rlens.append(len(resp))
            groups.append(g)
            sids.append(f"{pid}/{k}")
            metas.append({**m, "response_ids": resp, "finish_reason": gen.finish_reason})
            lps.extend(zeros)
            lps.extend(gen.logprobs)
            if vers is not None:
                stamped = len(gen.versions) == len(resp)
                vers = (vers + [0] * len(p) + (list(gen.versions) if stamped else [version] * len(resp))
                        if stamped or version is not None else None)
    batch = Batch.from_sequences(seqs, ids=sids, meta=metas, prompt_lens=plens)
    batch.set_mm([prompt_images(p) for p, glist in zip(prompt_ids, gens) for _ in glist])
    batch.add_token("rollout_logprobs", torch.tensor(lps, dtype=torch.float32))
    if vers is not None:
        batch.add_token("weight_version", torch.tensor(vers, dtype=torch.long))
    batch.add_sample("response_len", torch.tensor(rlens, dtype=torch.long))
    batch.add_sample("group", torch.tensor(groups, dtype=torch.long))
    routing = _routing([g for glist in gens for g in glist], batch.seqlens.tolist())
    if routing is not None:
        batch.add_token("routing", routing)
    return batch


def _routing(gens: Sequence[Generation], lens: Sequence[int]) -> torch.Tensor | None:
    """The ``routing`` token field of the generations' samples (``lens`` tokens each), None when
    no engine reported routing; a sample without it (or whose prompt the engine cut) gets -1
    (the trainer's router chooses)."""
    known = [g.routing for g in gens if g.routing is not None]
    if not known:
        return None
    layers, top_k = known[0].shape[1:]
    parts = [g.routing if g.routing is not None and g.routing.shape[0] == n
             else torch.full((n, layers, top_k), -1, dtype=known[0].dtype) for g, n in zip(gens, lens)]
    return torch.cat(parts)


class SingleTurnRollout(Rollout):
    """The default rollout: one engine call, one continuation per sample
    (:func:`encode_records`, then :func:`generations_to_batch`; ``env_reward`` is 0)."""

    def __init__(self, tokenizer: Any, vision: Any = None):
        self.tok = tokenizer
        self.vision = vision

    @classmethod
    def create(cls, ctx: RolloutContext) -> "SingleTurnRollout":
        return cls(ctx.tokenizer, ctx.vision)

    def run(self, records: Sequence[dict[str, Any]], n: int, sampling: SamplingParams, generate: GenerateFn,
            version: int = 0) -> Batch:
        prompt_ids, meta = encode_records(self.tok, records, self.vision)
        gens = generate(prompt_ids, dataclasses.replace(sampling, n=n))
        batch = generations_to_batch(prompt_ids, gens, [str(r.get("id", i)) for i, r in enumerate(records)], meta,
                                     version)
        batch.add_sample("env_reward", torch.zeros(len(batch), dtype=torch.float32))
        return batch


def make_rollout(run_config: Any, algorithm_config: Any, tokenizer: Any, vision: Any = None) -> tuple[Rollout, Any]:
    """``(rollout, its record)`` of a run (:mod:`rlweave.config.rollout`: ``rollout.name``, else
    ``multi_turn`` when the algorithm's config has that section, else ``single_turn``), built with
    :meth:`Rollout.create`; the record is a :class:`~rlweave.plugins.RolloutRecord`. ``vision``:
    the run's vision processor (a vision-language model), else None."""
    from rlweave.config.rollout import rollout_args, rollout_name
    from rlweave.plugins.manager import get_plugin_manager

    record = get_plugin_manager().get("rollout", rollout_name(run_config, algorithm_config), where="rollout.name")
    args = rollout_args(run_config, algorithm_config)
    if record.config_model is not None and isinstance(args, dict):
        args = record.config_model.model_validate(args)
    ctx = RolloutContext(tokenizer=tokenizer, args=args, algorithm=algorithm_config, vision=vision)
    return record.load().create(ctx), record
